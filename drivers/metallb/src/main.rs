//! `metallb-driver`: the MetalLB driver (SPEC §8), a drop-in replacement for the Go driver
//! of the platform: provisioner `metallb.drivers.local.sdn.cozystack.io`, class parameters
//! `addresses` (MetalLB's ranges). MetalLB stays the allocator of record: every address of
//! the driver's classes is held in MetalLB's books, and put on Services through MetalLB's own
//! annotations, without a gap. Everything but the MetalLB objects is the driver kit's.

mod metallb;
mod takeover;

use address_controller_driver_kit::Info;
use address_controller_driver_kit::runtime_rbac::Rule;

/// Who this driver is: the binary, its default Lease, its ClusterRole.
const INFO: Info = Info {
    name: address_controller_api::names::metallb_driver::NAME,
    cluster_role: "address-controller-metallb-driver",
    source: "drivers/metallb/src/main.rs (the driver kit's rules and MetalLB's)",
    extra_rules: &[
        Rule {
            group: "metallb.io",
            resources: &["ipaddresspools", "l2advertisements", "bgpadvertisements"],
            verbs: &["get", "list", "watch", "create", "patch", "delete"],
            why: "one pool and one advertisement per class, owned by the class (the pool kept by a finalizer while addresses of the class are left)",
        },
        Rule {
            group: "",
            resources: &["events"],
            verbs: &["list"],
            why: "why MetalLB refused a pinned Service (its AllocationFailed event), said in the Service's AddressAttached condition",
        },
    ],
    own_namespace_rules: &[Rule {
        group: "",
        resources: &["services"],
        verbs: &["create", "delete"],
        why: "the holds: placeholder Services that keep each address in MetalLB's books (--hold-namespace, the release's)",
    }],
};

/// jemalloc, as in the core: the same allocator for every binary of the project
/// (docs/design.md, "jemalloc").
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// The driver's one-shot subcommands.
#[derive(clap::Subcommand, Clone, Debug)]
enum Command {
    /// Take over from the Go MetalLB driver (metallb-iad) in place: its finalizers, pins and
    /// placeholders become this driver's, no address unheld at any moment. A dry run unless
    /// --yes.
    Takeover(takeover::TakeoverArgs),
}

fn main() -> anyhow::Result<std::process::ExitCode> {
    address_controller_driver_kit::main_with_commands(
        INFO,
        metallb::MetalLbArgs::driver,
        |command: Command| match command {
            Command::Takeover(args) => takeover::main(&args, INFO.name),
        },
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_flag_has_an_env_the_takeover_too() {
        let cmd = address_controller_driver_kit::command_line::<
            super::metallb::MetalLbArgs,
            super::Command,
        >(&super::INFO);
        let missing = address_controller_driver_kit::flags::without_env(&cmd);
        assert!(missing.is_empty(), "flags without env: {missing:?}");
    }

    #[test]
    fn committed_cluster_role_is_up_to_date() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../chart/address-controller/files/metallb-driver-role.yaml");
        let current =
            address_controller_driver_kit::cluster_role_file_is_current(&super::INFO, &path);
        assert!(current.is_ok(), "{current:?}");
    }
}
