//! The aggregated API server serving `view.local.sdn.cozystack.io/v1alpha1` (SPEC §9).
//! Built under issue #4; empty until then.
