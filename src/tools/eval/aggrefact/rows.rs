//! Rows of the LLM-AggreFact shape, read strictly from JSON Lines or CSV, and the subsets
//! an operator asks for (`--limit`, `--sample N --seed S`).
//!
//! Accepted columns (JSON keys or CSV header names, exact, lower case):
//! - `dataset`: non-blank text, the benchmark dataset the row belongs to;
//! - `doc`: non-blank text, the grounding document;
//! - `claim`: non-blank text, the claim to check against it;
//! - `label`: `1` (the document supports the claim) or `0`; in JSON an integer, `"0"`/`"1"`
//!   or a boolean, in CSV `0`/`1` (`true`/`false` too);
//! - `id` (optional): the row's name in the report, else `DATASET#N` (N its line or record
//!   number in the file).
//!
//! Any other column (the benchmark's `contamination_identifier`, an index) is ignored and
//! named in the report. Entry points: [`load_rows`], [`stratified_sample`].

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde_json::Value;

use crate::tools::eval::EvalError;

/// One benchmark row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AggreFactRow {
    /// `id`, else `DATASET#N`.
    pub id: String,
    pub dataset: String,
    pub doc: String,
    pub claim: String,
    /// The benchmark's label: the document supports the claim.
    pub supported: bool,
}

impl AggreFactRow {
    /// The label as the benchmark writes it.
    pub fn label(&self) -> u8 {
        u8::from(self.supported)
    }
}

/// The rows of a file and the columns it had that were ignored.
#[derive(Debug, Clone, Default)]
pub struct LoadedRows {
    pub rows: Vec<AggreFactRow>,
    pub ignored_columns: Vec<String>,
}

const COLUMNS: [&str; 5] = ["dataset", "doc", "claim", "label", "id"];

/// The largest benchmark file read unless `--max-bundle-bytes` says otherwise: the public
/// LLM-AggreFact test split is a few tens of MB.
pub const DEFAULT_MAX_ROWS_BYTES: u64 = 512 * 1024 * 1024;

/// Reads `path` (a regular file of at most `max_bytes`, else refused as `check` refuses a
/// bundle): JSON Lines when it ends in `.jsonl`, `.ndjson` or `.json`, CSV when it ends in
/// `.csv`, else JSON Lines if its first non-blank byte is `{`, CSV otherwise.
pub fn load_rows(path: &Path, max_bytes: u64) -> Result<LoadedRows, EvalError> {
    let text = crate::input_file::read_bounded(path, max_bytes)
        .map_err(|e| EvalError::Input(Box::new(e)))?;
    let extension = path
        .extension()
        .map(|e| e.to_string_lossy().to_ascii_lowercase());
    let json_lines = match extension.as_deref() {
        Some("jsonl" | "ndjson" | "json") => true,
        Some("csv") => false,
        _ => text.trim_start().starts_with('{'),
    };
    let loaded = if json_lines {
        parse_json_lines(&text)?
    } else {
        parse_csv(&text)?
    };
    if loaded.rows.is_empty() {
        return Err(EvalError::NoRows(path.to_path_buf()));
    }
    Ok(loaded)
}

fn bad(at: String, why: impl Into<String>) -> EvalError {
    EvalError::Case {
        case: at,
        why: why.into(),
    }
}

fn non_blank(at: &str, column: &str, value: Option<String>) -> Result<String, EvalError> {
    match value {
        Some(v) if !v.trim().is_empty() => Ok(v),
        Some(_) => Err(bad(at.into(), format!("{column} is blank"))),
        None => Err(bad(at.into(), format!("no {column}"))),
    }
}

fn label_of_text(at: &str, text: &str) -> Result<bool, EvalError> {
    match text.trim() {
        "1" | "true" => Ok(true),
        "0" | "false" => Ok(false),
        other => Err(bad(
            at.into(),
            format!("label must be 0 or 1, not {other:?}"),
        )),
    }
}

fn row(
    at: &str,
    number: usize,
    dataset: Option<String>,
    doc: Option<String>,
    claim: Option<String>,
    supported: bool,
    id: Option<String>,
) -> Result<AggreFactRow, EvalError> {
    let dataset = non_blank(at, "dataset", dataset)?;
    let doc = non_blank(at, "doc", doc)?;
    let claim = non_blank(at, "claim", claim)?;
    let id = match id {
        Some(id) if !id.trim().is_empty() => id,
        _ => format!("{dataset}#{number}"),
    };
    Ok(AggreFactRow {
        id,
        dataset,
        doc,
        claim,
        supported,
    })
}

/// One JSON object per non-blank line.
pub fn parse_json_lines(text: &str) -> Result<LoadedRows, EvalError> {
    let mut out = LoadedRows::default();
    let mut ignored = BTreeSet::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let at = format!("line {}", i + 1);
        let mut fields: serde_json::Map<String, Value> = serde_json::from_str(line)
            .map_err(|e| bad(at.clone(), format!("not a JSON object: {e}")))?;
        let mut text_field = |key: &str| -> Result<Option<String>, EvalError> {
            match fields.remove(key) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) => Ok(Some(s)),
                Some(Value::Number(n)) if key == "id" => Ok(Some(n.to_string())),
                Some(_) => Err(bad(at.clone(), format!("{key} must be a string"))),
            }
        };
        let dataset = text_field("dataset")?;
        let doc = text_field("doc")?;
        let claim = text_field("claim")?;
        let id = text_field("id")?;
        let supported = match fields.remove("label") {
            Some(Value::Number(n)) if n.as_u64() == Some(1) => true,
            Some(Value::Number(n)) if n.as_u64() == Some(0) => false,
            Some(Value::Bool(b)) => b,
            Some(Value::String(s)) => label_of_text(&at, &s)?,
            Some(other) => {
                return Err(bad(at, format!("label must be 0 or 1, not {other}")));
            }
            None => return Err(bad(at, "no label")),
        };
        ignored.extend(fields.keys().cloned());
        out.rows
            .push(row(&at, i + 1, dataset, doc, claim, supported, id)?);
    }
    out.ignored_columns = ignored.into_iter().collect();
    Ok(out)
}

/// A header row, then one record per row (RFC 4180 quoting: a quoted field may hold commas,
/// quotes written twice and line breaks).
pub fn parse_csv(text: &str) -> Result<LoadedRows, EvalError> {
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(true)
        .from_reader(text.as_bytes());
    let headers = reader
        .headers()
        .map_err(|e| bad("the header".into(), e.to_string()))?
        .clone();
    let position = |name: &str| headers.iter().position(|h| h.trim() == name);
    let [dataset, doc, claim, label, id] = COLUMNS.map(position);
    for (column, at) in [
        ("dataset", dataset),
        ("doc", doc),
        ("claim", claim),
        ("label", label),
    ] {
        if at.is_none() {
            return Err(bad(
                "the header".into(),
                format!("no {column} column (the columns are dataset, doc, claim, label)"),
            ));
        }
    }
    let mut out = LoadedRows {
        rows: Vec::new(),
        ignored_columns: headers
            .iter()
            .map(|h| h.trim().to_string())
            .filter(|h| !COLUMNS.contains(&h.as_str()))
            .collect(),
    };
    for (i, record) in reader.records().enumerate() {
        // Record numbers count data rows from 1 (a record may span several lines).
        let number = i + 1;
        let at = format!("record {number}");
        let record = record.map_err(|e| bad(at.clone(), e.to_string()))?;
        let field =
            |at_column: Option<usize>| at_column.and_then(|c| record.get(c)).map(str::to_string);
        let label_text = field(label).unwrap_or_default();
        let supported = label_of_text(&at, &label_text)?;
        out.rows.push(row(
            &at,
            number,
            field(dataset),
            field(doc),
            field(claim),
            supported,
            field(id),
        )?);
    }
    Ok(out)
}

/// SplitMix64: a fixed, documented generator, so that a seed selects the same sample on
/// every platform and every version of the harness.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (n > 0); the modulo bias is below 2^-40 for any file.
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// `n` rows drawn without replacement, stratified by (dataset, label): each stratum keeps
/// its share of `n` (largest remainders, ties to the stratum that comes first by name), and
/// within a stratum the rows are a seeded shuffle's first. The sample keeps the file's
/// order. All rows when `n` is at least their number.
pub fn stratified_sample(rows: Vec<AggreFactRow>, n: usize, seed: u64) -> Vec<AggreFactRow> {
    if n >= rows.len() {
        return rows;
    }
    let mut strata: BTreeMap<(String, bool), Vec<usize>> = BTreeMap::new();
    for (i, r) in rows.iter().enumerate() {
        strata
            .entry((r.dataset.clone(), r.supported))
            .or_default()
            .push(i);
    }
    let total = rows.len();
    // Quotas: floors of the exact shares, then one more to the largest remainders.
    let mut quotas: Vec<(usize, usize)> = strata
        .values()
        .map(|members| (members.len() * n / total, members.len() * n % total))
        .collect();
    let mut left = n - quotas.iter().map(|(q, _)| q).sum::<usize>();
    let mut by_remainder: Vec<usize> = (0..quotas.len()).collect();
    by_remainder.sort_by(|&a, &b| quotas[b].1.cmp(&quotas[a].1).then(a.cmp(&b)));
    for i in by_remainder {
        if left == 0 {
            break;
        }
        quotas[i].0 += 1;
        left -= 1;
    }
    let mut rng = SplitMix64(seed);
    let mut chosen: Vec<usize> = Vec::with_capacity(n);
    for (members, (quota, _)) in strata.into_values().zip(quotas) {
        let mut members = members;
        // Fisher-Yates, the first `quota` places only.
        for i in 0..quota.min(members.len()) {
            let j = i + rng.below(members.len() - i);
            members.swap(i, j);
        }
        chosen.extend_from_slice(&members[..quota.min(members.len())]);
    }
    chosen.sort_unstable();
    let mut keep = vec![false; rows.len()];
    for i in chosen {
        keep[i] = true;
    }
    rows.into_iter()
        .zip(keep)
        .filter_map(|(r, k)| k.then_some(r))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(spec: &[(&str, bool, usize)]) -> Vec<AggreFactRow> {
        let mut out = Vec::new();
        for (dataset, supported, count) in spec {
            for _ in 0..*count {
                let n = out.len();
                out.push(AggreFactRow {
                    id: format!("r{n}"),
                    dataset: dataset.to_string(),
                    doc: "d".into(),
                    claim: "c".into(),
                    supported: *supported,
                });
            }
        }
        out
    }

    #[test]
    fn json_lines_accept_the_benchmarks_columns_and_name_the_others() {
        let text = concat!(
            r#"{"dataset":"A","doc":"The sky is blue.","claim":"The sky is blue.","label":1,"contamination_identifier":"x"}"#,
            "\n\n",
            r#"{"dataset":"B","doc":"d","claim":"c","label":"0","id":"row-7"}"#,
            "\n",
            r#"{"dataset":"B","doc":"d","claim":"c","label":false}"#,
        );
        let loaded = parse_json_lines(text).unwrap();
        assert_eq!(loaded.rows.len(), 3);
        assert_eq!(loaded.rows[0].id, "A#1");
        assert!(loaded.rows[0].supported);
        assert_eq!(loaded.rows[1].id, "row-7");
        assert_eq!(loaded.rows[1].label(), 0);
        assert_eq!(loaded.rows[2].id, "B#4");
        assert_eq!(loaded.ignored_columns, ["contamination_identifier"]);
    }

    #[test]
    fn a_bad_row_names_its_line_and_what_is_wrong() {
        for (line, expected) in [
            (
                r#"{"dataset":"A","doc":"d","claim":"c","label":2}"#,
                "label must be 0 or 1",
            ),
            (
                r#"{"dataset":"A","doc":" ","claim":"c","label":1}"#,
                "doc is blank",
            ),
            (r#"{"dataset":"A","doc":"d","label":1}"#, "no claim"),
            (r#"{"dataset":"A","doc":"d","claim":"c"}"#, "no label"),
            (
                r#"{"dataset":3,"doc":"d","claim":"c","label":1}"#,
                "dataset must be a string",
            ),
            ("[1]", "not a JSON object"),
        ] {
            let err = parse_json_lines(&format!("\n{line}"))
                .unwrap_err()
                .to_string();
            assert!(err.contains("line 2"), "{err}");
            assert!(err.contains(expected), "{line}: {err}");
        }
    }

    #[test]
    fn csv_reads_quoted_multi_line_documents() {
        let text = "dataset,doc,claim,label,extra\n\
                    A,\"Line one, with a comma.\nLine \"\"two\"\".\",Line two is quoted.,1,x\n\
                    B,plain,other,0,y\n";
        let loaded = parse_csv(text).unwrap();
        assert_eq!(loaded.rows.len(), 2);
        assert_eq!(loaded.rows[0].doc, "Line one, with a comma.\nLine \"two\".");
        assert_eq!(loaded.rows[0].id, "A#1");
        assert_eq!(loaded.rows[1].id, "B#2");
        assert!(!loaded.rows[1].supported);
        assert_eq!(loaded.ignored_columns, ["extra"]);
        let err = parse_csv("dataset,doc,label\nA,d,1\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("no claim column"), "{err}");
        let err = parse_csv("dataset,doc,claim,label\nA,d,c,yes\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("record 1") && err.contains("label"), "{err}");
    }

    #[test]
    fn a_stratified_sample_keeps_each_datasets_label_shares() {
        // 60 / 20 / 15 / 5 of 100 rows; a sample of 20 keeps 12 / 4 / 3 / 1.
        let all = rows(&[
            ("A", true, 60),
            ("A", false, 20),
            ("B", true, 15),
            ("B", false, 5),
        ]);
        let sample = stratified_sample(all.clone(), 20, 7);
        assert_eq!(sample.len(), 20);
        let count = |d: &str, s: bool| {
            sample
                .iter()
                .filter(|r| r.dataset == d && r.supported == s)
                .count()
        };
        assert_eq!(
            (
                count("A", true),
                count("A", false),
                count("B", true),
                count("B", false)
            ),
            (12, 4, 3, 1)
        );
        // The file's order, and the same seed gives the same rows.
        let ids = |s: &[AggreFactRow]| s.iter().map(|r| r.id.clone()).collect::<Vec<_>>();
        let position = |id: &str| all.iter().position(|r| r.id == id).unwrap();
        assert!(ids(&sample)
            .windows(2)
            .all(|w| position(&w[0]) < position(&w[1])));
        assert_eq!(ids(&stratified_sample(all.clone(), 20, 7)), ids(&sample));
        assert_ne!(ids(&stratified_sample(all.clone(), 20, 8)), ids(&sample));
        assert_eq!(stratified_sample(all.clone(), 500, 1).len(), 100);
    }

    #[test]
    fn remainders_go_to_the_largest_shares() {
        // Shares of 4 over 3, 3 and 2 rows: 1.5, 1.5, 1.0 -> floors 1, 1, 1, and the one
        // left to the first largest remainder.
        let all = rows(&[("A", true, 3), ("B", true, 3), ("C", true, 2)]);
        let sample = stratified_sample(all, 4, 0);
        let count = |d: &str| sample.iter().filter(|r| r.dataset == d).count();
        assert_eq!((count("A"), count("B"), count("C")), (2, 1, 1));
    }
}
