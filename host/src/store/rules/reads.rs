//! How big a read is: its page when the caller names none, and how a read bounded in bytes
//! ends (the contract, sections 4.3 and 9.2): the same rules for every listing and for the
//! log's `read_within` and the inbox's `messages` with a `max_bytes`, on both backends.

/// The page of a listing (dispatches, messages, waitpoints) when the caller asks for 0.
pub const DEFAULT_PAGE: usize = 100;

/// The bytes of records a walk over a whole listing (a reconcile, the CLI's list) holds per
/// page.
pub const WALK_PAGE_BYTES: usize = 2 << 20;

/// The entries a read of a thread's log returns when the caller asks for 0.
pub const DEFAULT_LOG_READ: usize = 1000;

/// The size of a listing's page asked for as `limit`: [`DEFAULT_PAGE`] for 0.
pub(crate) fn page(limit: usize) -> usize {
    if limit == 0 { DEFAULT_PAGE } else { limit }
}

/// The entries of a log read asked for as `limit`: [`DEFAULT_LOG_READ`] for 0.
pub(crate) fn log_read(limit: usize) -> usize {
    if limit == 0 { DEFAULT_LOG_READ } else { limit }
}

/// The bytes a bounded read has taken against its budget. An item is taken while the budget
/// is still open; the item that brings the total to the budget or past it is the last one. So
/// the first item is always taken whatever its size, and a read holds at most its budget and
/// one item.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ByteBudget {
    taken: usize,
    items: usize,
    max: usize,
}

impl ByteBudget {
    /// A budget of `max` bytes (`None`: unbounded).
    pub(crate) fn new(max: Option<usize>) -> Self {
        ByteBudget {
            taken: 0,
            items: 0,
            max: max.unwrap_or(usize::MAX),
        }
    }

    /// Whether another item may be taken: the first always, a later one while the items
    /// taken are under the budget.
    pub(crate) fn open(&self) -> bool {
        self.items == 0 || self.taken < self.max
    }

    /// Counts an item of `bytes` as taken.
    pub(crate) fn take(&mut self, bytes: usize) {
        self.items += 1;
        self.taken = self.taken.saturating_add(bytes);
    }

    /// How many items a backend that fetches them one by one (NATS) may have in flight at
    /// once: as many as the budget holds at the largest size one can have (at least one, at
    /// most `cap`), so a bounded read never holds much more than its budget.
    pub(crate) fn in_flight(&self, largest: u64, cap: usize) -> usize {
        let largest = usize::try_from(largest.max(1)).unwrap_or(usize::MAX);
        (self.max / largest).clamp(1, cap.max(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Items of 40 bytes against 100: three are taken, the third reaching the budget.
    #[test]
    fn the_item_that_reaches_the_budget_is_the_last() {
        let mut b = ByteBudget::new(Some(100));
        let mut taken = 0;
        while b.open() && taken < 10 {
            b.take(40);
            taken += 1;
        }
        assert_eq!(taken, 3);
    }

    /// The first item is taken whatever its size; a zero budget still takes one.
    #[test]
    fn the_first_item_is_taken_whatever_its_size() {
        for max in [0, 1, 10] {
            let mut b = ByteBudget::new(Some(max));
            let mut taken = 0;
            while b.open() && taken < 10 {
                b.take(1_000);
                taken += 1;
            }
            assert_eq!(taken, 1, "max {max}");
        }
        assert!(ByteBudget::new(None).open());
    }

    /// In flight: the budget over the largest item, between one and the cap.
    #[test]
    fn in_flight_is_what_the_budget_holds_at_the_largest() {
        let b = ByteBudget::new(Some(1 << 20));
        assert_eq!(b.in_flight(64 << 10, 32), 16);
        assert_eq!(b.in_flight(8 << 20, 32), 1);
        assert_eq!(b.in_flight(1, 32), 32);
        assert_eq!(b.in_flight(0, 32), 32);
        assert_eq!(ByteBudget::new(None).in_flight(1 << 20, 8), 8);
    }
}
