//! At the connection cap, a newcomer closes the longest-idle connection
//! instead of being refused before, `CONNECTIONS_MAX`
//! idle tcp connections locked every new client out for good.

use fabrickv_transport::conformance_evict::at_the_cap_the_longest_idle_connection_makes_way;
use fabrickv_types::limits::CONNECTIONS_MAX;

#[test]
fn tcp_at_the_cap_the_longest_idle_connection_makes_way() {
    at_the_cap_the_longest_idle_connection_makes_way("tcp://127.0.0.1:0", CONNECTIONS_MAX);
}
