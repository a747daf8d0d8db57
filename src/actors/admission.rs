//! Admission per replica (`server.max_in_flight`): a count of the releases admitted and not
//! yet ended, shared by every worker. [`Admission::try_admit`] takes a place or says the
//! replica is full; the [`Admitted`] place is given back when dropped (the registry holds it
//! for as long as the run is in flight).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

#[derive(Debug, Clone)]
pub struct Admission {
    /// Places taken, over every worker of the replica.
    admitted: Arc<AtomicUsize>,
    limit: usize,
}

/// One admitted release's place; dropping it frees the place.
#[derive(Debug)]
pub struct Admitted {
    admitted: Arc<AtomicUsize>,
}

impl Admission {
    pub fn new(limit: usize) -> Admission {
        Admission {
            admitted: Arc::new(AtomicUsize::new(0)),
            limit,
        }
    }

    /// A place, or None when `limit` releases are admitted already.
    pub fn try_admit(&self) -> Option<Admitted> {
        self.admitted
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.limit).then_some(n + 1)
            })
            .ok()?;
        Some(Admitted {
            admitted: self.admitted.clone(),
        })
    }

    /// Whether a release arriving now would be refused (one atomic read: the door's check,
    /// before the body is read).
    pub fn is_full(&self) -> bool {
        self.admitted.load(Ordering::Acquire) >= self.limit
    }

    /// Releases admitted now.
    pub fn admitted(&self) -> usize {
        self.admitted.load(Ordering::Acquire)
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.admitted.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn places_are_bounded_and_given_back_on_drop() {
        let admission = Admission::new(2);
        let a = admission.try_admit().unwrap();
        assert!(!admission.is_full());
        let b = admission.try_admit().unwrap();
        assert!(admission.is_full());
        assert!(admission.try_admit().is_none());
        assert_eq!(admission.admitted(), 2, "a refusal takes no place");
        drop(a);
        assert!(!admission.is_full());
        let _c = admission.try_admit().unwrap();
        drop(b);
        assert_eq!(admission.admitted(), 1);
    }

    #[test]
    fn clones_share_the_count_across_workers() {
        let admission = Admission::new(1);
        let worker = admission.clone();
        let _held = admission.try_admit().unwrap();
        assert!(worker.try_admit().is_none());
    }
}
