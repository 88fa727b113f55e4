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
    name: "metallb-driver",
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

/// The MetalLB driver's own flags.
#[derive(clap::Args, Clone, Debug)]
struct MetalLbArgs {
    /// MetalLB's namespace (its `--namespace`): where the pools and advertisements go.
    #[arg(
        long,
        env = "ADDRESS_CONTROLLER_METALLB_DRIVER_METALLB_NAMESPACE",
        default_value = "metallb-system"
    )]
    metallb_namespace: String,
    /// Where the holds (placeholder Services) live: the driver's own namespace.
    #[arg(
        long,
        env = "ADDRESS_CONTROLLER_METALLB_DRIVER_HOLD_NAMESPACE",
        default_value = "address-controller-system"
    )]
    hold_namespace: String,
    /// The `spec.loadBalancerClass` MetalLB serves (its `--lb-class`); default: Services
    /// without one.
    #[arg(long, env = "ADDRESS_CONTROLLER_METALLB_DRIVER_LB_CLASS")]
    lb_class: Option<String>,
}

/// jemalloc, as in the core: the same allocator for every binary of the project
/// (docs/design.md, "jemalloc").
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> anyhow::Result<()> {
    // `metallb-driver takeover …`: the one-shot move from the Go driver (takeover.rs).
    if std::env::args().nth(1).as_deref() == Some("takeover") {
        use clap::Parser;
        let args = takeover::TakeoverArgs::parse_from(std::env::args().skip(1));
        args.log.init();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?;
        match runtime.block_on(takeover::run(&args, INFO.name)) {
            Ok(true) => return Ok(()),
            Ok(false) => std::process::exit(1),
            Err(e) => {
                eprintln!("metallb-driver takeover: {e:#}");
                std::process::exit(1);
            }
        }
    }
    address_controller_driver_kit::main_with(INFO, |a: &MetalLbArgs| metallb::MetalLb {
        metallb_namespace: a.metallb_namespace.clone(),
        hold_namespace: a.hold_namespace.clone(),
        lb_class: a.lb_class.clone(),
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn committed_cluster_role_is_up_to_date() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../chart/address-controller/files/metallb-driver-role.yaml");
        let current =
            address_controller_driver_kit::cluster_role_file_is_current(&super::INFO, &path);
        assert!(current.is_ok(), "{current:?}");
    }
}
