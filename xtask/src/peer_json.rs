//! The peers' JSON files (`tools/peers/*.py --json FILE`): `{"peer": NAME, "rows": [{...}]}`.
//! Every bench reads its peer's file the same way: the file before any GPU work, the name
//! ("" if absent), then each row through one closure that names the row in its errors.

use std::path::Path;

/// One row of a peer file, with getters whose errors name the row and the key.
pub struct Row<'a> {
    i: usize,
    v: &'a serde_json::Value,
}

impl Row<'_> {
    /// The row's raw value, for keys the getters do not cover.
    pub fn get(&self, k: &str) -> Option<&serde_json::Value> {
        self.v.get(k)
    }

    /// An error naming this row.
    pub fn err(&self, what: &str) -> String {
        format!("peer JSON row {}: {what}", self.i)
    }

    /// `k` as an integer > 0.
    pub fn pos_int(&self, k: &str) -> Result<i64, String> {
        self.v
            .get(k)
            .and_then(|x| x.as_i64())
            .filter(|&n| n > 0)
            .ok_or_else(|| self.err(&format!("no positive integer \"{k}\"")))
    }

    /// `k` as a finite number, if present.
    pub fn num(&self, k: &str) -> Option<f64> {
        self.v.get(k).and_then(|x| x.as_f64()).filter(|x| x.is_finite())
    }

    /// `k` as a finite number > 0 (a time), if present.
    pub fn pos_num(&self, k: &str) -> Option<f64> {
        self.num(k).filter(|&x| x > 0.0)
    }

    /// `k` as a finite number > 0, required.
    pub fn need_pos_num(&self, k: &str) -> Result<f64, String> {
        self.pos_num(k).ok_or_else(|| self.err(&format!("no positive number \"{k}\"")))
    }

    /// `k` as a string, if present.
    pub fn str(&self, k: &str) -> Option<&str> {
        self.v.get(k).and_then(|x| x.as_str())
    }

    /// `k` as a string, required.
    pub fn need_str(&self, k: &str) -> Result<String, String> {
        self.str(k).map(str::to_string).ok_or_else(|| self.err(&format!("no \"{k}\" string")))
    }
}

/// Parses `text`: the file's `peer` name ("" if absent) and `row` applied to every element of
/// its `rows` array, in order; the first error wins.
pub fn parse<T>(
    text: &str,
    mut row: impl FnMut(&Row<'_>) -> Result<T, String>,
) -> Result<(String, Vec<T>), String> {
    let v: serde_json::Value = serde_json::from_str(text).map_err(|e| format!("peer JSON: {e}"))?;
    let name = v.get("peer").and_then(|p| p.as_str()).unwrap_or("").to_string();
    let list = v.get("rows").and_then(|r| r.as_array()).ok_or("peer JSON: no \"rows\" array")?;
    let rows =
        list.iter().enumerate().map(|(i, v)| row(&Row { i, v })).collect::<Result<Vec<T>, String>>()?;
    Ok((name, rows))
}

/// Reads and parses the peer file at `f` with the bench's `parse_peer`; errors name the file.
pub fn read<P>(f: &Path, parse_peer: impl FnOnce(&str) -> Result<P, String>) -> Result<P, String> {
    let text = std::fs::read_to_string(f).map_err(|e| format!("reading {}: {e}", f.display()))?;
    parse_peer(&text).map_err(|e| format!("{}: {e}", f.display()))
}

/// How a timing protocol cleared the L2 before each timed call: by writing a large buffer
/// (`Write`: triton's `do_bench` zeroes 256 MB, leaving the L2 full of dirty lines that the
/// timed call then writes back as it allocates) or by reading one (`Read`: clean lines).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum L2Flush {
    #[default]
    Write,
    Read,
}

impl L2Flush {
    /// The word a peer file or our JSON uses: "write" or "read".
    pub fn word(self) -> &'static str {
        match self {
            L2Flush::Write => "write",
            L2Flush::Read => "read",
        }
    }

    /// What a bench prints of its flush (of the 256 MB `Bench` buffer).
    pub fn describe(self) -> &'static str {
        match self {
            L2Flush::Write => "writing 256 MB (dirty lines left in the L2, as do_bench)",
            L2Flush::Read => "reading 256 MB (clean L2)",
        }
    }
}

/// The file's top-level `l2_flush` ("write" or "read"); absent means "write", the protocol of
/// the peer scripts that time with `triton.testing.do_bench`.
pub fn l2_flush(text: &str) -> Result<L2Flush, String> {
    let v: serde_json::Value = serde_json::from_str(text).map_err(|e| format!("peer JSON: {e}"))?;
    match v.get("l2_flush") {
        None => Ok(L2Flush::Write),
        Some(x) => match x.as_str() {
            Some("write") => Ok(L2Flush::Write),
            Some("read") => Ok(L2Flush::Read),
            _ => Err(format!("peer JSON: \"l2_flush\" is {x}, not \"write\" or \"read\"")),
        },
    }
}

/// A peer timed with another L2 flush than this run's would put two protocols in one ratio:
/// an error that says how to time both alike (`clean`: the peer's option for the read flush;
/// `dirty`: this bench's option for the write flush).
pub fn same_flush(peer: L2Flush, ours: L2Flush, clean: &str, dirty: &str) -> Result<(), String> {
    if peer == ours {
        return Ok(());
    }
    Err(format!(
        "the peer file's L2 flush ({}) differs from this run's ({}): time both the same way \
         (the read flush: the peer's {clean}; the write flush: this bench's {dirty})",
        peer.word(),
        ours.word()
    ))
}

/// The first pair of rows with the same key, as an error ("rows j and i: the same shape ...").
pub fn no_repeats<T, K: PartialEq>(
    rows: &[T],
    key: impl Fn(&T) -> K,
    show: impl Fn(&K) -> String,
) -> Result<(), String> {
    for (i, r) in rows.iter().enumerate() {
        let k = key(r);
        if let Some(j) = rows[..i].iter().position(|o| key(o) == k) {
            return Err(format!("peer JSON rows {j} and {i}: the same shape {}", show(&k)));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_the_row_and_the_key() {
        let text = r#"{"peer": "p", "rows": [{"a": 1}, {"a": 0}]}"#;
        let e = parse(text, |r| r.pos_int("a")).expect_err("row 1 has a = 0");
        assert_eq!(e, "peer JSON row 1: no positive integer \"a\"");
        let (name, rows) =
            parse(r#"{"peer": "p", "rows": [{"a": 1}, {"a": 2}]}"#, |r| r.pos_int("a")).expect("parses");
        assert_eq!((name.as_str(), rows), ("p", vec![1, 2]));
        assert!(parse("[]", |r| r.pos_int("a")).is_err());
        assert!(parse("not json", |r| r.pos_int("a")).is_err());
        assert_eq!(
            no_repeats(&[1, 2, 1], |&x| x, |k| k.to_string()).expect_err("repeat"),
            "peer JSON rows 0 and 2: the same shape 1"
        );
    }

    #[test]
    fn the_l2_flush_defaults_to_write_and_rejects_other_words() {
        assert_eq!(l2_flush(r#"{"rows": []}"#), Ok(L2Flush::Write));
        assert_eq!(l2_flush(r#"{"l2_flush": "write", "rows": []}"#), Ok(L2Flush::Write));
        assert_eq!(l2_flush(r#"{"l2_flush": "read", "rows": []}"#), Ok(L2Flush::Read));
        for bad in [r#"{"l2_flush": "clean"}"#, r#"{"l2_flush": 1}"#, "not json"] {
            assert!(l2_flush(bad).is_err(), "{bad}");
        }
        assert_eq!(L2Flush::Read.word(), "read");
    }

    #[test]
    fn a_missing_file_is_named() {
        let e = read(Path::new("/nonexistent/peer.json"), |_| Ok(())).expect_err("no file");
        assert!(e.starts_with("reading /nonexistent/peer.json"), "{e}");
    }
}
