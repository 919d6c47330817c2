//! CPU lists in `taskset -c` syntax (`0`, `0,2`, `0-3,8`), as used by
//! `--worker-cpus` and the benchmarks' `--server-cpus` / `--client-cpus`.

/// Largest CPU id a list may name: Linux's largest `NR_CPUS` (8192) less
/// one. It also bounds the memory a list such as `0-4294967295` could ask
/// for.
pub const CPU_ID_MAX: usize = 8191;

/// Parses a CPU list, keeping its order (`1,0` pins the first worker to
/// CPU 1). Empty parts, reversed ranges and ids above [`CPU_ID_MAX`] are
/// refused with a message naming the list.
pub fn parse_cpu_list(s: &str) -> Result<Vec<usize>, String> {
    let bad = |why: &str| format!("bad CPU list {s:?}: {why} (expected e.g. 0,2-3)");
    let id = |t: &str| -> Result<usize, String> {
        let v: usize = t
            .trim()
            .parse()
            .map_err(|_| bad(&format!("{t:?} is not a CPU number")))?;
        if v > CPU_ID_MAX {
            return Err(bad(&format!("CPU {v} is above {CPU_ID_MAX}")));
        }
        Ok(v)
    };
    let mut out = Vec::new();
    for part in s.split(',') {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (id(a)?, id(b)?);
                if a > b {
                    return Err(bad(&format!("range {a}-{b} runs backwards")));
                }
                out.extend(a..=b);
            }
            None => out.push(id(part)?),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_and_ranges_keep_their_order() {
        assert_eq!(parse_cpu_list("0").expect("one"), vec![0]);
        assert_eq!(parse_cpu_list("1,0").expect("two"), vec![1, 0]);
        assert_eq!(parse_cpu_list("0-2, 5").expect("range"), vec![0, 1, 2, 5]);
    }

    #[test]
    fn bad_lists_are_refused_by_name() {
        for s in ["", "a", "0,,1", "3-1", "0-99999999999", "8192", "-1"] {
            let e = parse_cpu_list(s).expect_err(s);
            assert!(e.contains(&format!("{s:?}")), "{e}");
        }
        assert_eq!(parse_cpu_list("8191").expect("max"), vec![CPU_ID_MAX]);
    }
}
