//! The core controller: pure binding decisions and the reconcilers that apply them (SPEC §3–§7).
//! Built under issue #3; empty until then.
