//! Model integration tests: parity with the reference (ultralytics) on seeded random weights for
//! all five variants and on the real fixture checkpoint, checkpoint formats, bad input, and the
//! CUDA kernels run on the CPU.
//! Goldens come from `scripts/make_goldens.py`; fixtures from `../shared/fixtures/`.

mod bad_input;
mod common;
mod formats;
#[path = "../common/hostile.rs"]
mod hostile;
mod jpeg;
mod kernels;
mod parity;
mod resize;
#[path = "../common/runner.rs"]
mod runner;
mod seeded;
