//! Test support for running example programs under `uiw run`.
