//! Tests of store-postgres against a throwaway PostgreSQL cluster started by the tests.

mod cluster;
mod drains;
mod ports;
mod support;
mod two_connections;
