//! The API group the server serves: a leaf every module may name.

/// The API group of the views.
pub const GROUP: &str = "view.local.sdn.cozystack.io";
/// Its one version.
pub const VERSION: &str = "v1alpha1";
/// `apiVersion` of the views' objects.
pub const API_VERSION: &str = "view.local.sdn.cozystack.io/v1alpha1";
