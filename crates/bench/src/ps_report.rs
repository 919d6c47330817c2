//! PetPS's output, for `fabrickv bench ps`: the throughput line its
//! clients print, and the two markdown tables of its DRAM guide (single
//! client matrix of `thread_num` x `batch_read_count`, and multi-client
//! sums). Rates are in millions per second with 4 decimals, as PetPS
//! prints them; a row says PASS only when the values it read were checked.

use std::fmt::Write as _;

/// Decimals of every rate PetPS prints (`0.2373`).
pub const RATE_DECIMALS: usize = 4;

/// Header and separator of the single-client matrix.
pub const MATRIX_HEADER: &str =
    "| thread_num | batch_read_count | Mreq/s | Mkv/s | status |\n|---|---|---|---|---|\n";

/// Header and separator of the multi-client table.
pub const CLIENTS_HEADER: &str =
    "| clients | Mreq/s sum | Mkv/s sum | status |\n|---|---|---|---|\n";

/// Whether a row's reads were right.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Status {
    /// Every value read was checked and right.
    Pass,
    /// Something was wrong (or nothing was checked); why.
    Fail(String),
}

impl Status {
    /// PASS when `checked` values were read and none of them was wrong;
    /// a row that checked nothing has not passed.
    pub fn from_checks(checked: u64, wrong: u64) -> Status {
        if checked == 0 {
            Status::Fail("no value was checked".into())
        } else if wrong > 0 {
            Status::Fail(format!("{wrong} of {checked} values wrong"))
        } else {
            Status::Pass
        }
    }

    /// Whether this is [`Status::Pass`].
    pub fn passed(&self) -> bool {
        *self == Status::Pass
    }

    /// The table cell: `PASS`, or `FAIL (why)` with any `|` escaped and
    /// line breaks flattened so the markdown row stays one row.
    pub fn cell(&self) -> String {
        match self {
            Status::Pass => "PASS".into(),
            Status::Fail(why) => {
                let why = why.replace('|', "\\|").replace(['\r', '\n'], " ");
                format!("FAIL ({why})")
            }
        }
    }

    /// The JSON fields: `"status"` (`PASS` or `FAIL`) and, on failure,
    /// `"reason"`.
    fn add_json(&self, v: &mut serde_json::Value) {
        match self {
            Status::Pass => v["status"] = "PASS".into(),
            Status::Fail(why) => {
                v["status"] = "FAIL".into();
                v["reason"] = why.clone().into();
            }
        }
    }
}

/// A rate with PetPS's 4 decimals.
fn rate(v: f64) -> String {
    format!("{v:.RATE_DECIMALS$}")
}

/// The line PetPS's client prints: `throughput 0.0277 Mreq/s 2.7690 Mkv/s`
/// (millions of requests and of key-values per second).
pub fn throughput_line(mreq_s: f64, mkv_s: f64) -> String {
    format!("throughput {} Mreq/s {} Mkv/s", rate(mreq_s), rate(mkv_s))
}

/// One row of the single-client matrix.
#[derive(Debug, Clone, PartialEq)]
pub struct MatrixRow {
    /// Client threads (PetPS `--thread_num`).
    pub thread_num: usize,
    /// Keys per batched pull (PetPS `--batch_read_count`).
    pub batch_read_count: usize,
    /// Millions of pull requests per second.
    pub mreq_s: f64,
    /// Millions of key-values pulled per second.
    pub mkv_s: f64,
    /// Whether the pulled values were checked and right.
    pub status: Status,
}

impl MatrixRow {
    /// The JSON line (`"bench":"ps.matrix"`).
    pub fn json(&self) -> String {
        let mut v = serde_json::json!({
            "bench": "ps.matrix",
            "thread_num": self.thread_num,
            "batch_read_count": self.batch_read_count,
            "mreq_s": self.mreq_s,
            "mkv_s": self.mkv_s,
        });
        self.status.add_json(&mut v);
        v.to_string()
    }
}

/// The single-client matrix, as in PetPS's guide:
///
/// ```text
/// | thread_num | batch_read_count | Mreq/s | Mkv/s | status |
/// |---|---|---|---|---|
/// | 1 | 100 | 0.0277 | 2.7690 | PASS |
/// ```
///
/// Every line ends with a newline.
pub fn matrix_table(rows: &[MatrixRow]) -> String {
    let mut out = String::from(MATRIX_HEADER);
    for r in rows {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} |",
            r.thread_num,
            r.batch_read_count,
            rate(r.mreq_s),
            rate(r.mkv_s),
            r.status.cell()
        );
    }
    out
}

/// One row of the multi-client table: every client's rates summed.
#[derive(Debug, Clone, PartialEq)]
pub struct ClientsRow {
    /// Client processes run at once.
    pub clients: usize,
    /// Their millions of pull requests per second, summed.
    pub mreq_s_sum: f64,
    /// Their millions of key-values pulled per second, summed.
    pub mkv_s_sum: f64,
    /// PASS only when every client's values were checked and right.
    pub status: Status,
    /// Spread of the clients' measured starts (last minus first), in
    /// milliseconds: how far apart the barrier released them.
    pub start_skew_ms: f64,
}

impl ClientsRow {
    /// The JSON line (`"bench":"ps.clients"`).
    pub fn json(&self) -> String {
        let mut v = serde_json::json!({
            "bench": "ps.clients",
            "clients": self.clients,
            "mreq_s_sum": self.mreq_s_sum,
            "mkv_s_sum": self.mkv_s_sum,
            "start_skew_ms": self.start_skew_ms,
        });
        self.status.add_json(&mut v);
        v.to_string()
    }
}

/// The multi-client table, as in PetPS's guide:
///
/// ```text
/// | clients | Mreq/s sum | Mkv/s sum | status |
/// |---|---|---|---|
/// | 2 | 0.0002 | 0.0160 | PASS |
/// ```
///
/// Every line ends with a newline.
pub fn clients_table(rows: &[ClientsRow]) -> String {
    let mut out = String::from(CLIENTS_HEADER);
    for r in rows {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} |",
            r.clients,
            rate(r.mreq_s_sum),
            rate(r.mkv_s_sum),
            r.status.cell()
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(thread_num: usize, batch_read_count: usize, mreq_s: f64, mkv_s: f64) -> MatrixRow {
        MatrixRow {
            thread_num,
            batch_read_count,
            mreq_s,
            mkv_s,
            status: Status::Pass,
        }
    }

    #[test]
    fn throughput_line_has_four_decimals() {
        assert_eq!(
            throughput_line(0.0277, 2.769),
            "throughput 0.0277 Mreq/s 2.7690 Mkv/s"
        );
        assert_eq!(
            throughput_line(12.0, 1234.56789),
            "throughput 12.0000 Mreq/s 1234.5679 Mkv/s"
        );
    }

    #[test]
    fn matrix_matches_petps() {
        // Lines copied from PetPS's guide (single client matrix).
        let petps = "\
| thread_num | batch_read_count | Mreq/s | Mkv/s | status |
|---|---|---|---|---|
| 1 | 1 | 0.2373 | 0.2373 | PASS |
| 1 | 100 | 0.0277 | 2.7690 | PASS |
| 8 | 50 | 0.2672 | 13.3604 | PASS |
";
        let rows = [
            row(1, 1, 0.2373, 0.2373),
            row(1, 100, 0.02769, 2.769),
            row(8, 50, 0.26721, 13.36036),
        ];
        assert_eq!(matrix_table(&rows), petps);
        assert_eq!(matrix_table(&[]), MATRIX_HEADER);
    }

    #[test]
    fn clients_table_matches_petps() {
        // Lines copied from PetPS's guide (multi-client, medium scale).
        let petps = "\
| clients | Mreq/s sum | Mkv/s sum | status |
|---|---|---|---|
| 2 | 0.0002 | 0.0160 | PASS |
| 8 | 0.0000 | 0.0066 | PASS |
";
        let rows = [
            ClientsRow {
                clients: 2,
                mreq_s_sum: 0.00016,
                mkv_s_sum: 0.016,
                status: Status::Pass,
                start_skew_ms: 1.5,
            },
            ClientsRow {
                clients: 8,
                mreq_s_sum: 0.00004,
                mkv_s_sum: 0.0066,
                status: Status::Pass,
                start_skew_ms: 0.0,
            },
        ];
        assert_eq!(clients_table(&rows), petps);
    }

    #[test]
    fn a_failure_stays_one_row() {
        let mut r = row(2, 10, 1.0, 10.0);
        r.status = Status::Fail("3 wrong | 1\nmissing".into());
        let t = matrix_table(&[r]);
        assert_eq!(t.lines().count(), 3);
        assert!(
            t.ends_with("| 2 | 10 | 1.0000 | 10.0000 | FAIL (3 wrong \\| 1 missing) |\n"),
            "{t}"
        );
    }

    #[test]
    fn status_from_checks() {
        assert_eq!(Status::from_checks(10, 0), Status::Pass);
        assert!(Status::from_checks(10, 0).passed());
        assert!(!Status::from_checks(0, 0).passed());
        assert_eq!(
            Status::from_checks(10, 2),
            Status::Fail("2 of 10 values wrong".into())
        );
    }

    #[test]
    fn json_lines() {
        let v: serde_json::Value =
            serde_json::from_str(&row(4, 100, 0.0945, 9.4457).json()).expect("json");
        assert_eq!(v["bench"], "ps.matrix");
        assert_eq!(v["thread_num"], 4);
        assert_eq!(v["batch_read_count"], 100);
        assert_eq!(v["mkv_s"], 9.4457);
        assert_eq!(v["status"], "PASS");
        assert!(v.get("reason").is_none());
        let c = ClientsRow {
            clients: 4,
            mreq_s_sum: 0.0004,
            mkv_s_sum: 0.0024,
            status: Status::Fail("no value was checked".into()),
            start_skew_ms: 2.25,
        };
        let line = c.json();
        assert!(!line.contains('\n'));
        let v: serde_json::Value = serde_json::from_str(&line).expect("json");
        assert_eq!(v["bench"], "ps.clients");
        assert_eq!(v["clients"], 4);
        assert_eq!(v["mreq_s_sum"], 0.0004);
        assert_eq!(v["start_skew_ms"], 2.25);
        assert_eq!(v["status"], "FAIL");
        assert_eq!(v["reason"], "no value was checked");
    }
}
