//! `range-driver`: the reference driver (SPEC §8). It provisions IPAddresses for claims of
//! classes whose provisioner is `range.drivers.local.sdn.cozystack.io`, from the CIDRs in
//! the class's `spec.parameters.cidrs`, and publishes each class's capacity. It does no
//! association: there is no backend to pin an address to. Everything but the allocator is
//! the driver kit's.

mod allocator;
mod range;

use address_controller_driver_kit::Info;

/// Who this driver is: the binary, its default Lease, the chart's ClusterRole for it.
const INFO: Info = Info {
    name: "range-driver",
    cluster_role: "address-controller-range-driver",
    source: "driver/src/main.rs (the driver kit's rules)",
    extra_rules: &[],
};

fn main() -> anyhow::Result<()> {
    address_controller_driver_kit::main(range::Range, INFO)
}

#[cfg(test)]
mod tests {
    #[test]
    fn committed_cluster_role_is_up_to_date() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../chart/address-controller/files/range-driver-role.yaml");
        let got = std::fs::read_to_string(&path).unwrap_or_default();
        let want = address_controller_driver_kit::cluster_role_yaml(&super::INFO);
        assert!(
            want.as_ref().is_ok_and(|w| *w == got),
            "{} is stale; run `make manifests`",
            path.display()
        );
    }
}
