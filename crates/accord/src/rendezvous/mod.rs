//! Rendezvous: the key-value store ranks use to find each other, and the init methods.
//!
//! (Documentation is completed together with the init methods.)

pub mod client;
pub mod protocol;
pub mod server;

pub use client::StoreClient;
pub use server::StoreServer;
