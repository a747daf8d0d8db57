//! The model adapter: request building ([`prompts`]), the HTTP client ([`client`]) and the
//! bounds on what a server sends ([`capped`]), the chat-completion envelope it reads
//! ([`envelope`]), strict answer reading ([`verdict`]).
//! Retry, timeouts, budgets and cancellation are the
//! actors' job (`actors::semantic_guard`, `actors::repair`).

pub mod body;
pub mod capped;
pub mod client;
pub mod envelope;
pub mod gate;
pub mod prompts;
pub mod verdict;

pub use client::{ClientError, ModelClient, SendFailure};
pub use gate::ModelGate;
pub use prompts::PreparedRequest;
