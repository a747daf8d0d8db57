//! The model adapter: request building ([`prompts`]), the HTTP client ([`client`]) and the
//! bounds on what a server sends ([`capped`]), the chat-completion envelope it reads
//! ([`envelope`]), strict answer reading ([`verdict`]), and one exchange's reading from
//! what the send gave back to its outcome ([`exchange`]).
//! Retry, timeouts, budgets and cancellation are the
//! actors' job (`actors::semantic_guard`, `actors::repair`).

pub mod body;
pub mod capped;
pub mod client;
pub mod envelope;
pub mod exchange;
pub mod gate;
pub mod prompts;
pub mod verdict;

pub use client::{ClientError, ModelClient, SendFailure};
pub use gate::ModelGate;
pub use prompts::PreparedRequest;
