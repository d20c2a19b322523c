//! Integration tests of the egress proxy over real sockets on 127.0.0.1, compiled into one
//! binary. Each test starts its own proxy (listeners on port 0) and its own origin
//! servers; names reach them through `add_hosts` (`origin.test`, `echo.test` ->
//! 127.0.0.1). Everything stops when the test's values drop.

mod connect;
mod dns;
mod http;
mod inject;
mod live;
mod socks;
mod support;
