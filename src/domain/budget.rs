//! The per-run model budget: calls, tokens and bytes across repair and SemanticGuard.
//!
//! Entry points: [`Budget::reserve`] before a call is sent (a denial means it is not
//! sent) and [`Budget::settle`] once it ends, replacing the estimate by what was used.

use serde::Serialize;

use super::audit::BudgetUse;

/// Per-run limits (config section `budget`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BudgetLimits {
    pub max_model_calls: u32,
    pub max_tokens: u64,
    pub max_bytes: u64,
}

/// What one call costs (estimated before, actual after).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct Cost {
    pub tokens: u64,
    pub bytes: u64,
}

/// Tokens estimated from bytes before a call: a conservative 1 token per 4 bytes.
pub fn estimate_tokens(bytes: u64) -> u64 {
    bytes.div_ceil(4)
}

/// A granted reservation; hand it back to [`Budget::settle`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub struct Reservation {
    estimate: Cost,
}

/// Which limit would be exceeded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, thiserror::Error)]
#[serde(rename_all = "snake_case")]
pub enum BudgetDenied {
    #[error("the run's model call budget ({max}) is spent")]
    ModelCalls { max: u32 },
    #[error("the call needs ~{needed} tokens but {remaining} remain")]
    Tokens { needed: u64, remaining: u64 },
    #[error("the call needs up to {needed} bytes but {remaining} remain")]
    Bytes { needed: u64, remaining: u64 },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Budget {
    limits: BudgetLimits,
    calls: u32,
    used: Cost,
}

impl Budget {
    pub fn new(limits: BudgetLimits) -> Self {
        Budget {
            limits,
            calls: 0,
            used: Cost::default(),
        }
    }

    /// Reserves one call with its worst-case cost, or says which limit forbids it.
    pub fn reserve(&mut self, estimate: Cost) -> Result<Reservation, BudgetDenied> {
        if self.calls >= self.limits.max_model_calls {
            return Err(BudgetDenied::ModelCalls {
                max: self.limits.max_model_calls,
            });
        }
        let tokens_left = self.limits.max_tokens.saturating_sub(self.used.tokens);
        if estimate.tokens > tokens_left {
            return Err(BudgetDenied::Tokens {
                needed: estimate.tokens,
                remaining: tokens_left,
            });
        }
        let bytes_left = self.limits.max_bytes.saturating_sub(self.used.bytes);
        if estimate.bytes > bytes_left {
            return Err(BudgetDenied::Bytes {
                needed: estimate.bytes,
                remaining: bytes_left,
            });
        }
        self.calls += 1;
        self.used.tokens += estimate.tokens;
        self.used.bytes += estimate.bytes;
        Ok(Reservation { estimate })
    }

    /// Replaces the reservation's estimate by the actual cost; `None` (e.g. a timeout with
    /// no usage reported) keeps the estimate, so unknown usage is never counted as free.
    pub fn settle(&mut self, reservation: Reservation, actual: Option<Cost>) {
        if let Some(actual) = actual {
            // Saturating: a count the model reports is never trusted to be small.
            self.used.tokens = (self.used.tokens)
                .saturating_sub(reservation.estimate.tokens)
                .saturating_add(actual.tokens);
            self.used.bytes = (self.used.bytes)
                .saturating_sub(reservation.estimate.bytes)
                .saturating_add(actual.bytes);
        }
    }

    /// Gives a reservation back whole: the call was never sent (the model gate refused it),
    /// so it spent neither a call nor its estimate.
    pub fn refund(&mut self, reservation: Reservation) {
        self.calls = self.calls.saturating_sub(1);
        self.used.tokens = self.used.tokens.saturating_sub(reservation.estimate.tokens);
        self.used.bytes = self.used.bytes.saturating_sub(reservation.estimate.bytes);
    }

    pub fn usage(&self) -> BudgetUse {
        BudgetUse {
            model_calls: self.calls,
            tokens: self.used.tokens,
            bytes: self.used.bytes,
            max_model_calls: self.limits.max_model_calls,
            max_tokens: self.limits.max_tokens,
            max_bytes: self.limits.max_bytes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> BudgetLimits {
        BudgetLimits {
            max_model_calls: 3,
            max_tokens: 1000,
            max_bytes: 10_000,
        }
    }

    #[test]
    fn a_refunded_reservation_costs_nothing() {
        let mut budget = Budget::new(limits());
        let kept = budget
            .reserve(Cost {
                tokens: 10,
                bytes: 100,
            })
            .unwrap();
        let unsent = budget
            .reserve(Cost {
                tokens: 500,
                bytes: 5000,
            })
            .unwrap();
        budget.refund(unsent);
        budget.settle(kept, None);
        let usage = budget.usage();
        assert_eq!((usage.model_calls, usage.tokens, usage.bytes), (1, 10, 100));
    }

    #[test]
    fn calls_are_counted_and_capped() {
        let mut budget = Budget::new(limits());
        for _ in 0..3 {
            let r = budget
                .reserve(Cost {
                    tokens: 1,
                    bytes: 1,
                })
                .unwrap();
            budget.settle(r, None);
        }
        assert_eq!(
            budget.reserve(Cost::default()),
            Err(BudgetDenied::ModelCalls { max: 3 })
        );
        assert_eq!(budget.usage().model_calls, 3);
    }

    #[test]
    fn token_and_byte_limits_deny_before_sending() {
        let mut budget = Budget::new(limits());
        assert!(matches!(
            budget.reserve(Cost {
                tokens: 1001,
                bytes: 1
            }),
            Err(BudgetDenied::Tokens {
                needed: 1001,
                remaining: 1000
            })
        ));
        assert!(matches!(
            budget.reserve(Cost {
                tokens: 1,
                bytes: 10_001
            }),
            Err(BudgetDenied::Bytes { .. })
        ));
        assert_eq!(
            budget.usage().model_calls,
            0,
            "a denied call is not counted"
        );
    }

    #[test]
    fn settling_replaces_the_estimate() {
        let mut budget = Budget::new(limits());
        let r = budget
            .reserve(Cost {
                tokens: 800,
                bytes: 5000,
            })
            .unwrap();
        budget.settle(
            r,
            Some(Cost {
                tokens: 120,
                bytes: 900,
            }),
        );
        assert_eq!((budget.usage().tokens, budget.usage().bytes), (120, 900));
        let r = budget
            .reserve(Cost {
                tokens: 800,
                bytes: 5000,
            })
            .unwrap();
        budget.settle(r, None);
        assert_eq!(budget.usage().tokens, 920);
    }

    #[test]
    fn estimate_rounds_up() {
        assert_eq!(estimate_tokens(0), 0);
        assert_eq!(estimate_tokens(1), 1);
        assert_eq!(estimate_tokens(8), 2);
        assert_eq!(estimate_tokens(9), 3);
    }
}
