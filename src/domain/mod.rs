//! Pure domain logic: no actix, Redis, HTTP or clock in here.
//!
//! - [`draft`]: the Draft and its strict parser.
//! - [`invocation`]: canonical invocation records and tool projections.
//! - [`scope`]: a projection's scope, as parsed and as shown.
//! - [`evidence_guard`]: EvidenceGuard rules and the no-conclusion reference review.
//! - [`identifiers`]: the run's call ids and Redis keys, found and masked in text.
//! - [`text`]: text as people read it (invisible controls dropped, NFKC).
//! - [`bounded`]: what is copied from records, masked and bounded.
//! - [`snapshot`]: the verified snapshot, the ProgressSnapshot and verified sources.
//! - [`repair_check`]: the comparison a repaired Draft must pass.
//! - [`request`]: a release request and its validation.
//! - [`outcome`]: stop reasons, outcomes and fallback types, with their labels.
//! - [`release`]: the release decision and the release result.
//! - [`budget`]: the per-run model budget.
//! - [`audit`]: the operators' audit record.
//! - [`decision`]: an entry of the decision stream `P:decisions`.
//! - [`json`]: the JSON text the harness writes (fast, byte-identical to `serde_json`).
//!
//! Label enums (a rule, an outcome, a fallback type, a cancel source...) are declared with
//! [`labels!`]: each variant and its label (the metric label and the JSON name) once.

/// Declares a label enum once: its variants, each with its label, which is its name in
/// JSON (serde) and in metric labels ([`as_str`](#method.as_str)), and `ALL`, every variant
/// in declaration order (so that each metric series can exist from start-up). The derives
/// (with `serde::Serialize` and maybe `Deserialize`) are the caller's.
macro_rules! labels {
    (
        $(#[$meta:meta])*
        pub enum $name:ident {
            $($(#[$variant_meta:meta])* $variant:ident = $label:literal,)+
        }
    ) => {
        $(#[$meta])*
        pub enum $name {
            $($(#[$variant_meta])* #[serde(rename = $label)] $variant,)+
        }

        impl $name {
            pub const ALL: [$name; [$($label),+].len()] = [$($name::$variant),+];

            /// The label: the metric label and the JSON name.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $label,)+
                }
            }
        }
    };
}

pub mod audit;
pub mod bounded;
pub mod budget;
pub mod decision;
pub mod draft;
pub mod evidence_guard;
pub mod identifiers;
pub mod invocation;
pub mod json;
pub mod outcome;
pub mod release;
pub mod repair_check;
pub mod request;
pub mod scope;
pub mod snapshot;
pub mod text;
