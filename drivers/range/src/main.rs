//! `range-driver`: the reference driver (SPEC §8). It provisions IPAddresses for claims of
//! classes whose provisioner is `range.drivers.local.sdn.cozystack.io`, from the CIDRs in
//! the class's `spec.parameters.cidrs`, publishes each class's capacity, and is the load
//! balancer of the Services it serves: a claim's addresses go into the `status.loadBalancer`
//! of the Service that names it. Everything but the allocator and the ingress writes is the
//! driver kit's.

mod range;

use address_controller_driver_kit::Info;

/// Who this driver is: the binary, its default Lease, the chart's ClusterRole for it.
const INFO: Info = Info {
    name: "range-driver",
    cluster_role: "address-controller-range-driver",
    source: "drivers/range/src/main.rs (the driver kit's rules)",
    extra_rules: &[],
    own_namespace_rules: &[],
};

/// The range driver's own flags.
#[derive(clap::Args, Clone, Debug)]
struct RangeArgs {
    /// Serve the LoadBalancer Services with this `spec.loadBalancerClass` (default: those
    /// without one), as MetalLB's --lb-class.
    #[arg(long, env = "ADDRESS_CONTROLLER_RANGE_DRIVER_LB_CLASS")]
    lb_class: Option<String>,
}

/// jemalloc, as in the core: the same allocator for every binary of the project
/// (docs/design.md, "jemalloc").
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> anyhow::Result<()> {
    address_controller_driver_kit::main_with(INFO, |a: &RangeArgs| range::Range {
        lb_class: a.lb_class.clone(),
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_flag_has_an_env() {
        let cmd = address_controller_driver_kit::command_line::<
            super::RangeArgs,
            address_controller_driver_kit::NoCommands,
        >(&super::INFO);
        let missing = address_controller_driver_kit::flags::without_env(&cmd);
        assert!(missing.is_empty(), "flags without env: {missing:?}");
    }

    #[test]
    fn committed_cluster_role_is_up_to_date() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../chart/address-controller/files/range-driver-role.yaml");
        let current =
            address_controller_driver_kit::cluster_role_file_is_current(&super::INFO, &path);
        assert!(current.is_ok(), "{current:?}");
    }
}
