//! Parity tests of every kernel against independent naive references written from the math in the module
//! docs (and, for RMSNorm / RoPE / softplus, against hand-computed values).
