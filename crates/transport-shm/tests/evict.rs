//! At the connection cap, a newcomer closes the longest-idle connection
//! instead of being refused before,
//! `SHM_CONNECTIONS_MAX` idle shm connections locked every new client out
//! for good.

use fabrickv_transport::conformance_evict::at_the_cap_the_longest_idle_connection_makes_way;
use fabrickv_transport_shm::SHM_CONNECTIONS_MAX;

mod common;
use common::unique;

#[test]
fn shm_at_the_cap_the_longest_idle_connection_makes_way() {
    let addr = format!("shm://{}", unique("evict"));
    at_the_cap_the_longest_idle_connection_makes_way(&addr, SHM_CONNECTIONS_MAX);
}
