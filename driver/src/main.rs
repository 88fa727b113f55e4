//! `range-driver`: the reference driver (SPEC §8). It provisions IPAddresses for claims of
//! classes whose provisioner is `range.drivers.local.sdn.cozystack.io`, from the CIDRs in
//! the class's `spec.parameters.cidrs`, and publishes each class's capacity. It does no
//! association: there is no backend to pin an address to. Everything but the allocator is
//! the driver kit's.

mod allocator;
mod range;

fn main() -> anyhow::Result<()> {
    address_controller_driver_kit::main(
        range::Range,
        address_controller_driver_kit::Info {
            name: "range-driver",
            cluster_role: "address-controller-range-driver",
            source: "driver/src/main.rs (the driver kit's rules)",
            extra_rules: &[],
        },
    )
}
