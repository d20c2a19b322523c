//! All end-to-end tests in one binary, one module per area.

mod sandbox;
