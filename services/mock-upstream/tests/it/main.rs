//! The mock upstream's integration tests, in one binary.

mod modern;
mod stdio;
