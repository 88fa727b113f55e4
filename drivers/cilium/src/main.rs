//! `cilium-driver`: the Cilium LB-IPAM driver (SPEC §8): provisioner
//! `cilium.drivers.local.sdn.cozystack.io`, class parameters `addresses` (the MetalLB
//! driver's, so a class moves between the two by its provisioner alone). The cilium-operator
//! stays the allocator of record: every address of the driver's classes is held in LB-IPAM's
//! books and put on Services through LB-IPAM's own annotations, without a gap. Everything but
//! the Cilium objects is the driver kit's.

mod cilium;
mod takeover;

use address_controller_driver_kit::Info;
use address_controller_driver_kit::runtime_rbac::Rule;

/// Who this driver is: the binary, its default Lease, its ClusterRole.
const INFO: Info = Info {
    name: "cilium-driver",
    cluster_role: "address-controller-cilium-driver",
    source: "drivers/cilium/src/main.rs (the driver kit's rules and Cilium's)",
    extra_rules: &[Rule {
        group: "cilium.io",
        resources: &["ciliumloadbalancerippools"],
        verbs: &["get", "list", "watch", "create", "patch", "delete"],
        why: "one pool per class, owned by the class, serving only the Services the driver pins (kept by a finalizer while addresses of the class are left)",
    }],
    own_namespace_rules: &[Rule {
        group: "",
        resources: &["services"],
        verbs: &["create", "delete"],
        why: "the holds: placeholder Services that keep each address in LB-IPAM's books (--hold-namespace, the release's)",
    }],
};

/// jemalloc, as in the core: the same allocator for every binary of the project
/// (docs/design.md, "jemalloc").
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// The driver's one-shot subcommands.
#[derive(clap::Subcommand, Clone, Debug)]
enum Command {
    /// Move the MetalLB driver's classes, holds and pinned Services into Cilium LB-IPAM in
    /// place, no Service without its address at any moment (--undo: back). A dry run unless
    /// --yes.
    Takeover(takeover::TakeoverArgs),
}

fn main() -> anyhow::Result<std::process::ExitCode> {
    address_controller_driver_kit::main_with_commands(
        INFO,
        cilium::CiliumArgs::driver,
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
            super::cilium::CiliumArgs,
            super::Command,
        >(&super::INFO);
        let missing = address_controller_driver_kit::flags::without_env(&cmd);
        assert!(missing.is_empty(), "flags without env: {missing:?}");
    }

    #[test]
    fn committed_cluster_role_is_up_to_date() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../chart/address-controller/files/cilium-driver-role.yaml");
        let current =
            address_controller_driver_kit::cluster_role_file_is_current(&super::INFO, &path);
        assert!(current.is_ok(), "{current:?}");
    }
}
