//! The LLM-AggreFact report: per row what the harness made of it, per dataset and overall
//! the leaderboard's figure and the rates an operator gates on, rendered as a terminal
//! table, JSON and Markdown. Pure arithmetic.
//!
//! A row *fits* when its document reached the judge whole (it was judged, or every
//! permitted attempt failed technically); a row *over budget* did not fit the judge's input
//! budget and was never sent (in `serve` that Draft fails closed). "Released" means judged
//! SUPPORTED; a technical failure is not released. Over the rows that fit:
//! - balanced accuracy = (released label-1 rows / label-1 rows + not released label-0 rows
//!   / label-0 rows) / 2, the leaderboard's figure (null without rows of both labels);
//! - balanced accuracy, fail closed: the same over every row, over-budget rows counted as
//!   not released (what `serve` would release);
//! - false-release rate: label-0 rows judged SUPPORTED / label-0 rows;
//! - false-block rate: label-1 rows judged UNSUPPORTED / label-1 rows;
//! - technical-failure rate: rows with no valid verdict / rows.
//!
//! The leaderboard's average is the mean of the datasets' balanced accuracies
//! (`balanced_accuracy_dataset_mean`); `overall` pools every row.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use serde::Serialize;

use crate::config::Config;
use crate::tools::eval::report::{
    outcome_counts, percentile, AttemptSummary, LatencyStats, ModelUnderTest, TokenStats,
};

/// What the harness made of a row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RowJudged {
    Supported,
    Unsupported,
    /// No valid verdict within the permitted attempts (SEMANTIC_UNAVAILABLE): not released.
    TechnicalFailure,
    /// The document does not fit the judge's input budget: never sent, never cut.
    OverBudget(String),
    /// The row never reached the judge for another reason: a harness problem.
    NotJudged(String),
}

impl RowJudged {
    pub fn as_str(&self) -> &'static str {
        match self {
            RowJudged::Supported => "SUPPORTED",
            RowJudged::Unsupported => "UNSUPPORTED",
            RowJudged::TechnicalFailure => "TECHNICAL_FAILURE",
            RowJudged::OverBudget(_) => "OVER_BUDGET",
            RowJudged::NotJudged(_) => "NOT_JUDGED",
        }
    }
}

impl Serialize for RowJudged {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// One row's result.
#[derive(Debug, Clone, Serialize)]
pub struct RowResult {
    pub id: String,
    pub dataset: String,
    /// The benchmark's label (1 = supported).
    pub label: u8,
    pub judged: RowJudged,
    /// Why a row was over budget or not judged.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
    /// The judge's reason (bounded), when it gave a verdict.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The document's size and the RAG hits it became.
    pub doc_bytes: usize,
    pub excerpts: usize,
    pub attempts: Vec<AttemptSummary>,
}

impl RowResult {
    fn latency_ms(&self) -> f64 {
        self.attempts.iter().map(|a| a.latency_ms).sum()
    }

    fn tokens(&self) -> (u64, u64) {
        self.attempts.iter().fold((0, 0), |(p, c), a| {
            (
                p + a.prompt_tokens.unwrap_or(0),
                c + a.completion_tokens.unwrap_or(0),
            )
        })
    }

    /// Whether the document reached the judge whole.
    fn fits(&self) -> bool {
        matches!(
            self.judged,
            RowJudged::Supported | RowJudged::Unsupported | RowJudged::TechnicalFailure
        )
    }
}

/// Rows of one label and what became of them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct LabelRow {
    pub rows: usize,
    pub judged_supported: usize,
    pub judged_unsupported: usize,
    pub technical_failure: usize,
    pub over_budget: usize,
    pub not_judged: usize,
}

impl LabelRow {
    fn add(&mut self, judged: &RowJudged) {
        self.rows += 1;
        match judged {
            RowJudged::Supported => self.judged_supported += 1,
            RowJudged::Unsupported => self.judged_unsupported += 1,
            RowJudged::TechnicalFailure => self.technical_failure += 1,
            RowJudged::OverBudget(_) => self.over_budget += 1,
            RowJudged::NotJudged(_) => self.not_judged += 1,
        }
    }

    /// Rows whose document reached the judge.
    pub fn fit(&self) -> usize {
        self.judged_supported + self.judged_unsupported + self.technical_failure
    }

    fn not_released(&self) -> usize {
        self.judged_unsupported + self.technical_failure
    }
}

/// The figures of a set of rows (one dataset, or all).
#[derive(Debug, Clone, Serialize)]
pub struct Figures {
    pub rows: usize,
    /// Rows labelled 1 (supported) and 0.
    pub label_1: LabelRow,
    pub label_0: LabelRow,
    /// Over the rows that fit; null without rows of both labels.
    pub balanced_accuracy: Option<f64>,
    /// Over every judged or over-budget row, over budget = not released.
    pub balanced_accuracy_fail_closed: Option<f64>,
    pub false_release_rate: Option<f64>,
    pub false_block_rate: Option<f64>,
    pub technical_failure_rate: Option<f64>,
    /// Rows whose document did not fit the judge's input budget.
    pub over_budget: usize,
    pub not_judged: usize,
    /// Model attempts that failed for a protocol reason.
    pub protocol_failures: usize,
    pub latency_ms: LatencyStats,
    pub tokens: TokenStats,
}

pub(crate) fn rate(numerator: usize, denominator: usize) -> Option<f64> {
    (denominator > 0).then(|| numerator as f64 / denominator as f64)
}

/// (true-positive rate + true-negative rate) / 2, when both exist.
pub fn balanced_accuracy(
    positives_released: usize,
    positives: usize,
    negatives_blocked: usize,
    negatives: usize,
) -> Option<f64> {
    Some((rate(positives_released, positives)? + rate(negatives_blocked, negatives)?) / 2.0)
}

impl Figures {
    fn of<'a>(rows: impl Iterator<Item = &'a RowResult>, schema_enforced: bool) -> Figures {
        let (mut label_1, mut label_0) = (LabelRow::default(), LabelRow::default());
        let mut latencies = Vec::new();
        let (mut prompt_total, mut completion_total, mut protocol_failures) = (0, 0, 0);
        for r in rows {
            if r.label == 1 {
                label_1.add(&r.judged);
            } else {
                label_0.add(&r.judged);
            }
            protocol_failures += r
                .attempts
                .iter()
                .filter(|a| a.is_protocol_failure(schema_enforced))
                .count();
            if r.fits() {
                latencies.push(r.latency_ms());
                let (p, c) = r.tokens();
                prompt_total += p;
                completion_total += c;
            }
        }
        latencies.sort_by(f64::total_cmp);
        let n = latencies.len().max(1) as f64;
        let fit = label_1.fit() + label_0.fit();
        let technical = label_1.technical_failure + label_0.technical_failure;
        Figures {
            rows: label_1.rows + label_0.rows,
            balanced_accuracy: balanced_accuracy(
                label_1.judged_supported,
                label_1.fit(),
                label_0.not_released(),
                label_0.fit(),
            ),
            balanced_accuracy_fail_closed: balanced_accuracy(
                label_1.judged_supported,
                label_1.fit() + label_1.over_budget,
                label_0.not_released() + label_0.over_budget,
                label_0.fit() + label_0.over_budget,
            ),
            false_release_rate: rate(label_0.judged_supported, label_0.fit()),
            false_block_rate: rate(label_1.judged_unsupported, label_1.fit()),
            technical_failure_rate: rate(technical, fit),
            over_budget: label_1.over_budget + label_0.over_budget,
            not_judged: label_1.not_judged + label_0.not_judged,
            protocol_failures,
            latency_ms: LatencyStats {
                mean: latencies.iter().sum::<f64>() / n,
                p50: percentile(&latencies, 50.0),
                p95: percentile(&latencies, 95.0),
                max: latencies.last().copied().unwrap_or(0.0),
            },
            tokens: TokenStats {
                prompt_mean: prompt_total as f64 / n,
                completion_mean: completion_total as f64 / n,
                prompt_total,
                completion_total,
            },
            label_1,
            label_0,
        }
    }

    fn fit(&self) -> usize {
        self.label_1.fit() + self.label_0.fit()
    }
}

/// How the rows were chosen.
#[derive(Debug, Clone, Serialize)]
pub struct Selection {
    /// Rows in the file.
    pub file_rows: usize,
    /// `--limit N`: the first N rows.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit: Option<usize>,
    /// `--sample N --seed S`: a stratified sample.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sample: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
}

/// The whole report (`report.json`).
#[derive(Debug, Clone, Serialize)]
pub struct AggreFactReport {
    /// Always `aggrefact`.
    pub format: &'static str,
    pub source: String,
    pub selection: Selection,
    /// Columns of the file that were ignored.
    pub ignored_columns: Vec<String>,
    pub model: ModelUnderTest,
    /// The limits the documents met: excerpt bytes and hits per call, the judge's input.
    pub max_excerpt_bytes: usize,
    pub max_entries_per_call: usize,
    pub max_input_bytes: u64,
    pub duration_s: f64,
    pub overall: Figures,
    /// The mean of the datasets' balanced accuracies (the leaderboard's average); null
    /// when a dataset has none.
    pub balanced_accuracy_dataset_mean: Option<f64>,
    pub datasets: BTreeMap<String, Figures>,
    /// Model attempts by outcome.
    pub attempt_outcomes: BTreeMap<String, usize>,
    pub results: Vec<RowResult>,
}

impl AggreFactReport {
    pub fn build(
        source: String,
        selection: Selection,
        ignored_columns: Vec<String>,
        config: &Config,
        duration: Duration,
        results: Vec<RowResult>,
    ) -> AggreFactReport {
        let schema_enforced = config.model.structured_output.enforces_schema();
        let mut by_dataset: BTreeMap<&str, Vec<&RowResult>> = BTreeMap::new();
        let mut attempt_outcomes: BTreeMap<String, usize> = BTreeMap::new();
        for r in &results {
            by_dataset.entry(r.dataset.as_str()).or_default().push(r);
            for a in &r.attempts {
                *attempt_outcomes.entry(a.outcome.clone()).or_default() += 1;
            }
        }
        let datasets: BTreeMap<String, Figures> = by_dataset
            .into_iter()
            .map(|(name, rows)| {
                (
                    name.to_string(),
                    Figures::of(rows.into_iter(), schema_enforced),
                )
            })
            .collect();
        let balanced_accuracy_dataset_mean = datasets
            .values()
            .map(|f| f.balanced_accuracy)
            .collect::<Option<Vec<f64>>>()
            .filter(|all| !all.is_empty())
            .map(|all| all.iter().sum::<f64>() / all.len() as f64);
        AggreFactReport {
            format: "aggrefact",
            source,
            selection,
            ignored_columns,
            model: ModelUnderTest {
                base_url: config.model.base_url.clone(),
                name: config.model.name.clone(),
                structured_output: config.model.structured_output.as_str(),
            },
            max_excerpt_bytes: config.snapshot.max_excerpt_bytes.get(),
            max_entries_per_call: config.snapshot.max_entries_per_call.get(),
            max_input_bytes: config.semantic_guard.max_input_bytes,
            duration_s: duration.as_secs_f64(),
            overall: Figures::of(results.iter(), schema_enforced),
            balanced_accuracy_dataset_mean,
            datasets,
            attempt_outcomes,
            results,
        }
    }

    /// Why `eval` exits 1: the false-release rate over `max_false_release`, more protocol
    /// failures than `max_protocol_failures`, or a row that never reached the judge for a
    /// reason other than its size. Empty when it passes.
    pub fn failures(
        &self,
        max_false_release: Option<f64>,
        max_protocol_failures: Option<usize>,
    ) -> Vec<String> {
        let mut failed = Vec::new();
        if let (Some(max), Some(rate)) = (max_false_release, self.overall.false_release_rate) {
            if rate > max {
                failed.push(format!(
                    "false-release rate {rate:.3} is above --max-false-release {max}"
                ));
            }
        }
        if let Some(max) = max_protocol_failures {
            if self.overall.protocol_failures > max {
                failed.push(format!(
                    "{} protocol failure(s), more than --max-protocol-failures {max}",
                    self.overall.protocol_failures
                ));
            }
        }
        if self.overall.not_judged > 0 {
            failed.push(format!(
                "{} row(s) never reached the judge (see report.md)",
                self.overall.not_judged
            ));
        }
        failed
    }

    fn line(name: &str, f: &Figures) -> [String; 11] {
        [
            name.to_string(),
            f.rows.to_string(),
            f.fit().to_string(),
            pct(f.balanced_accuracy),
            pct(f.balanced_accuracy_fail_closed),
            pct(f.false_release_rate),
            pct(f.false_block_rate),
            f.label_1
                .technical_failure
                .saturating_add(f.label_0.technical_failure)
                .to_string(),
            f.over_budget.to_string(),
            format!("{:.0}", f.latency_ms.p50),
            format!("{:.0}", f.tokens.prompt_mean),
        ]
    }

    const HEADER: [&'static str; 11] = [
        "dataset",
        "rows",
        "fit",
        "bal. acc.",
        "fail-closed",
        "false-release",
        "false-block",
        "technical",
        "over budget",
        "p50 ms",
        "prompt tok",
    ];

    fn lines(&self) -> Vec<[String; 11]> {
        let mut lines: Vec<[String; 11]> = self
            .datasets
            .iter()
            .map(|(name, f)| Self::line(name, f))
            .collect();
        lines.push(Self::line("all rows", &self.overall));
        lines
    }

    /// The terminal summary.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "judge {} at {} (structured_output {}), {} rows of {} in {:.1} s",
            self.model.name,
            self.model.base_url,
            self.model.structured_output,
            self.overall.rows,
            self.source,
            self.duration_s
        );
        let _ = writeln!(out);
        let name_width = self
            .datasets
            .keys()
            .map(|k| k.chars().count())
            .max()
            .unwrap_or(0)
            .max(8);
        let row = |out: &mut String, cells: &[String]| {
            let _ = write!(out, "{:<name_width$}", cells[0]);
            for (cell, header) in cells[1..].iter().zip(&Self::HEADER[1..]) {
                let _ = write!(out, "  {:>w$}", cell, w = header.len());
            }
            let _ = writeln!(out);
        };
        row(&mut out, &Self::HEADER.map(str::to_string));
        for line in self.lines() {
            row(&mut out, &line);
        }
        let _ = writeln!(out);
        for (name, value) in self.summary() {
            let _ = writeln!(out, "{name:<40} {value}");
        }
        out
    }

    fn summary(&self) -> Vec<(&'static str, String)> {
        let o = &self.overall;
        vec![
            (
                "balanced accuracy, mean of datasets",
                pct(self.balanced_accuracy_dataset_mean),
            ),
            ("balanced accuracy, all rows pooled", pct(o.balanced_accuracy)),
            (
                "false-release rate (label 0 released)",
                format!(
                    "{} ({}/{})",
                    pct(o.false_release_rate),
                    o.label_0.judged_supported,
                    o.label_0.fit()
                ),
            ),
            (
                "false-block rate (label 1 judged UNSUP.)",
                format!(
                    "{} ({}/{})",
                    pct(o.false_block_rate),
                    o.label_1.judged_unsupported,
                    o.label_1.fit()
                ),
            ),
            (
                "technical failures (not released)",
                format!(
                    "{} ({}/{})",
                    pct(o.technical_failure_rate),
                    o.label_1.technical_failure + o.label_0.technical_failure,
                    o.fit()
                ),
            ),
            (
                "rows over the judge's input budget",
                format!(
                    "{} of {} (never sent, never cut; excerpts of {} bytes, {} per call, {}-byte judge input)",
                    o.over_budget,
                    o.rows,
                    self.max_excerpt_bytes,
                    self.max_entries_per_call,
                    self.max_input_bytes
                ),
            ),
            (
                "latency per row (ms)",
                format!(
                    "mean {:.0}, p50 {:.0}, p95 {:.0}, max {:.0}",
                    o.latency_ms.mean, o.latency_ms.p50, o.latency_ms.p95, o.latency_ms.max
                ),
            ),
            (
                "tokens per row",
                format!(
                    "prompt {:.0}, completion {:.1} (total {} + {})",
                    o.tokens.prompt_mean,
                    o.tokens.completion_mean,
                    o.tokens.prompt_total,
                    o.tokens.completion_total
                ),
            ),
            (
                "attempts by outcome",
                outcome_counts(&self.attempt_outcomes),
            ),
            ("protocol failures", o.protocol_failures.to_string()),
            ("rows not judged", o.not_judged.to_string()),
        ]
    }

    /// `report.md`.
    pub fn markdown(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "# Judge evaluation on LLM-AggreFact rows\n");
        let _ = writeln!(
            out,
            "Model `{}` at `{}`, structured output `{}`; rows from `{}` ({} of {} in the file{}), judged in {:.1} s.\n",
            self.model.name,
            self.model.base_url,
            self.model.structured_output,
            self.source,
            self.overall.rows,
            self.selection.file_rows,
            match (self.selection.limit, self.selection.sample, self.selection.seed) {
                (Some(n), _, _) => format!(", the first {n}"),
                (_, Some(n), Some(seed)) => format!(", a stratified sample of {n} with seed {seed}"),
                _ => String::new(),
            },
            self.duration_s
        );
        let _ = writeln!(
            out,
            "Each row was judged through the harness's own release path: the document as the \
             verified evidence of one analysis (one RAG call's hits, the document split into \
             excerpts of at most {} bytes), the claim as that analysis's text and the \
             conclusion. The judge saw the evidence in its snapshot form, with the harness's \
             prompt, not the benchmark's.\n",
            self.max_excerpt_bytes
        );
        let _ = writeln!(out, "| | value |\n|---|---|");
        for (name, value) in self.summary() {
            let _ = writeln!(out, "| {name} | {value} |");
        }
        let _ = writeln!(out, "\n## By dataset\n");
        let _ = writeln!(out, "| {} |", Self::HEADER.join(" | "));
        let _ = writeln!(out, "|{}", "---|".repeat(Self::HEADER.len()));
        for line in self.lines() {
            let _ = writeln!(out, "| {} |", line.join(" | "));
        }
        let _ = writeln!(out, "\n## By label\n");
        let _ = writeln!(
            out,
            "| label \\ judged | rows | SUPPORTED | UNSUPPORTED | technical failure | over budget | not judged |\n|---|---|---|---|---|---|---|"
        );
        for (name, row) in [("1", &self.overall.label_1), ("0", &self.overall.label_0)] {
            let _ = writeln!(
                out,
                "| {name} | {} | {} | {} | {} | {} | {} |",
                row.rows,
                row.judged_supported,
                row.judged_unsupported,
                row.technical_failure,
                row.over_budget,
                row.not_judged
            );
        }
        if !self.ignored_columns.is_empty() {
            let _ = writeln!(
                out,
                "\nColumns ignored: {}.",
                self.ignored_columns.join(", ")
            );
        }
        let _ = writeln!(out, "\n## Rows\n");
        let _ = writeln!(
            out,
            "| row | dataset | label | judged | doc bytes | excerpts | model ms | attempts | reason |\n|---|---|---|---|---|---|---|---|---|"
        );
        for r in &self.results {
            let attempts = r
                .attempts
                .iter()
                .map(|a| a.outcome.as_str())
                .collect::<Vec<_>>()
                .join(", ");
            let reason = r
                .why
                .clone()
                .or_else(|| r.reason.clone())
                .unwrap_or_default();
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {:.0} | {} | {} |",
                cell(&r.id),
                cell(&r.dataset),
                r.label,
                r.judged.as_str(),
                r.doc_bytes,
                r.excerpts,
                r.latency_ms(),
                attempts,
                cell(&reason)
            );
        }
        out
    }
}

fn pct(r: Option<f64>) -> String {
    match r {
        Some(r) => format!("{:.1}%", r * 100.0),
        None => "n/a".to_string(),
    }
}

fn cell(text: &str) -> String {
    text.replace('|', "\\|").replace('\n', " ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(dataset: &str, label: u8, judged: RowJudged) -> RowResult {
        let attempts = match judged {
            RowJudged::OverBudget(_) | RowJudged::NotJudged(_) => Vec::new(),
            _ => vec![AttemptSummary {
                role: "semantic".into(),
                outcome: if judged == RowJudged::TechnicalFailure {
                    "timeout".into()
                } else {
                    "ok".into()
                },
                detail: None,
                latency_ms: 100.0,
                prompt_tokens: Some(1000),
                completion_tokens: Some(20),
                request_bytes: 4000,
            }],
        };
        RowResult {
            id: format!("{dataset}-{label}"),
            dataset: dataset.into(),
            label,
            judged,
            why: None,
            reason: None,
            doc_bytes: 10,
            excerpts: 1,
            attempts,
        }
    }

    fn report(results: Vec<RowResult>) -> AggreFactReport {
        AggreFactReport::build(
            "rows.jsonl".into(),
            Selection {
                file_rows: results.len(),
                limit: None,
                sample: None,
                seed: None,
            },
            Vec::new(),
            &Config::defaults(),
            Duration::from_secs(1),
            results,
        )
    }

    use RowJudged::*;

    #[test]
    fn balanced_accuracy_by_hand() {
        // A: label 1 -> S, S, U (TPR 2/3); label 0 -> U, S (TNR 1/2): BA 7/12.
        // B: label 1 -> S, technical (TPR 1/2); label 0 -> U, U (TNR 1): BA 3/4.
        // Pooled: label 1 released 3/5, label 0 blocked 3/4: BA 27/40.
        let r = report(vec![
            row("A", 1, Supported),
            row("A", 1, Supported),
            row("A", 1, Unsupported),
            row("A", 0, Unsupported),
            row("A", 0, Supported),
            row("B", 1, Supported),
            row("B", 1, TechnicalFailure),
            row("B", 0, Unsupported),
            row("B", 0, Unsupported),
        ]);
        let close = |a: Option<f64>, b: f64| (a.unwrap() - b).abs() < 1e-12;
        assert!(close(r.datasets["A"].balanced_accuracy, 7.0 / 12.0));
        assert!(close(r.datasets["B"].balanced_accuracy, 0.75));
        assert!(close(r.overall.balanced_accuracy, 27.0 / 40.0));
        assert!(close(
            r.balanced_accuracy_dataset_mean,
            (7.0 / 12.0 + 0.75) / 2.0
        ));
        assert!(close(r.overall.false_release_rate, 1.0 / 4.0));
        assert!(close(r.overall.false_block_rate, 1.0 / 5.0));
        assert!(close(r.overall.technical_failure_rate, 1.0 / 9.0));
        assert!(close(r.datasets["B"].false_block_rate, 0.0));
        assert_eq!(r.overall.label_1.technical_failure, 1);
        assert!(r.failures(Some(0.25), Some(0)).is_empty());
        assert_eq!(r.failures(Some(0.2), None).len(), 1);
        let table = r.table();
        assert!(table.contains("58.3%"), "{table}");
        assert!(table.contains("67.5%"), "{table}");
        assert!(
            r.markdown().contains("| B | 4 | 4 | 75.0% |"),
            "{}",
            r.markdown()
        );
    }

    #[test]
    fn over_budget_rows_are_reported_apart_and_fail_closed() {
        // Fit: label 1 -> S; label 0 -> U: BA 1. Over budget: one of each label. Fail
        // closed: label 1 released 1/2, label 0 blocked 2/2: BA 3/4.
        let r = report(vec![
            row("A", 1, Supported),
            row("A", 0, Unsupported),
            row("A", 1, OverBudget("too long".into())),
            row("A", 0, OverBudget("too long".into())),
        ]);
        let a = &r.datasets["A"];
        assert_eq!(a.balanced_accuracy, Some(1.0));
        assert_eq!(a.balanced_accuracy_fail_closed, Some(0.75));
        assert_eq!(a.over_budget, 2);
        assert_eq!(a.false_release_rate, Some(0.0));
        assert_eq!(
            a.latency_ms.mean, 100.0,
            "over-budget rows take no model time"
        );
        assert!(
            r.failures(None, None).is_empty(),
            "over budget is reported, not a failure"
        );
        assert!(r.table().contains("rows over the judge's input budget"));
    }

    #[test]
    fn one_label_only_has_no_balanced_accuracy_and_not_judged_rows_fail_the_run() {
        let r = report(vec![
            row("A", 1, Supported),
            row("B", 1, Supported),
            row("B", 0, NotJudged("EvidenceGuard".into())),
        ]);
        assert_eq!(r.datasets["A"].balanced_accuracy, None);
        assert_eq!(r.balanced_accuracy_dataset_mean, None);
        assert_eq!(r.overall.not_judged, 1);
        assert_eq!(r.failures(None, None).len(), 1);
        assert!(r.table().contains("n/a"));
    }
}
