//! The Budget actor: the run's model budget (calls, tokens, bytes) shared by the Repair
//! and SemanticGuard actors. A call reserves before it is sent and settles after.

use actix::{Handler, Message};

use crate::domain::audit::BudgetUse;
use crate::domain::budget::{Budget, BudgetDenied, BudgetLimits, Cost, Reservation};

pub struct BudgetActor {
    budget: Budget,
}

impl BudgetActor {
    pub fn new(limits: BudgetLimits) -> Self {
        BudgetActor {
            budget: Budget::new(limits),
        }
    }
}

run_child!(BudgetActor);

/// Sent by a model-calling actor before sending: reserve one call with its worst-case
/// cost. Answers the reservation or which limit denies it (then nothing is sent).
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "Result<Reservation, BudgetDenied>")]
pub struct Reserve(pub Cost);

/// Sent after a call ends: replace the estimate by the reported cost (None keeps it).
/// Answers the run's budget use so far.
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "BudgetUse")]
pub struct Settle {
    pub reservation: Reservation,
    pub actual: Option<Cost>,
}

/// Sent when a reserved call was not sent after all (the model gate refused it): the
/// reservation is given back whole. Answers the run's budget use so far.
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "BudgetUse")]
pub struct Refund(pub Reservation);

impl Handler<Refund> for BudgetActor {
    type Result = actix::MessageResult<Refund>;
    fn handle(&mut self, msg: Refund, _: &mut Self::Context) -> Self::Result {
        self.budget.refund(msg.0);
        actix::MessageResult(self.budget.usage())
    }
}

/// The run's budget use so far.
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "BudgetUse")]
pub struct Usage;

impl Handler<Reserve> for BudgetActor {
    type Result = Result<Reservation, BudgetDenied>;
    fn handle(&mut self, msg: Reserve, _: &mut Self::Context) -> Self::Result {
        self.budget.reserve(msg.0)
    }
}

impl Handler<Settle> for BudgetActor {
    type Result = actix::MessageResult<Settle>;
    fn handle(&mut self, msg: Settle, _: &mut Self::Context) -> Self::Result {
        self.budget.settle(msg.reservation, msg.actual);
        actix::MessageResult(self.budget.usage())
    }
}

impl Handler<Usage> for BudgetActor {
    type Result = actix::MessageResult<Usage>;
    fn handle(&mut self, _: Usage, _: &mut Self::Context) -> Self::Result {
        actix::MessageResult(self.budget.usage())
    }
}
