//! Rendezvous: the key-value store ranks use to find each other, and the init methods.
