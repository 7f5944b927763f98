//! Tests of store-postgres against a throwaway PostgreSQL cluster started by the tests.

mod cluster;
mod ports;
mod support;
mod two_connections;
