//! The rule every binary's flags follow: a flag that sets a value can be set from the
//! environment too (`env`, `ADDRESS_CONTROLLER_…`), as a chart or a GitOps tool sets it —
//! except the flags a person must type each time. Each binary's test walks its whole
//! command tree with [`without_env`].

/// Flags without a variable by design (their clap ids):
/// * a confirmation of a write that destroys or overrides (`--yes`, `--force`,
///   `--delete-crds`, `--objects`, `--over-quota`): an environment never says yes;
/// * a one-shot mode (`--undo`, `--finish`, `--print-cluster-role`);
/// * `--kubeconfig`: `$KUBECONFIG` keeps kubectl's meaning (a list of files), read by the
///   client itself;
/// * `help`, `version`, and hidden `testing_*` flags.
pub const NO_ENV_BY_DESIGN: &[&str] = &[
    "yes",
    "force",
    "delete_crds",
    "objects",
    "over_quota",
    "undo",
    "finish",
    "print_cluster_role",
    "kubeconfig",
    "help",
    "version",
];

/// The flags of CMD and of its subcommands, as `cmd sub --flag`, that have no `env` and
/// are not exempt by [`NO_ENV_BY_DESIGN`]. Positional arguments are not flags.
pub fn without_env(cmd: &clap::Command) -> Vec<String> {
    let mut out = Vec::new();
    walk(cmd, cmd.get_name(), &mut out);
    out
}

fn walk(cmd: &clap::Command, path: &str, out: &mut Vec<String>) {
    for arg in cmd.get_arguments() {
        let id = arg.get_id().as_str();
        if arg.is_positional()
            || arg.get_env().is_some()
            || NO_ENV_BY_DESIGN.contains(&id)
            || (arg.is_hide_set() && id.starts_with("testing_"))
        {
            continue;
        }
        out.push(format!("{path} --{}", arg.get_long().unwrap_or(id)));
    }
    for sub in cmd.get_subcommands() {
        walk(sub, &format!("{path} {}", sub.get_name()), out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{Arg, ArgAction, Command};

    #[test]
    fn a_flag_without_env_is_named_with_its_subcommand_and_the_exempt_are_not() {
        let cmd = Command::new("bin")
            .arg(Arg::new("level").long("level").env("X_LEVEL"))
            .arg(Arg::new("yes").long("yes").action(ArgAction::SetTrue))
            .arg(Arg::new("file"))
            .subcommand(
                Command::new("sub")
                    .arg(Arg::new("class").long("class"))
                    .arg(Arg::new("testing_delay").long("testing-delay").hide(true)),
            );
        assert_eq!(without_env(&cmd), ["bin sub --class"]);
    }
}
