//! What a soak run measured, as JSON and as an SVG plot (latency percentiles and process
//! memory over time).

use std::collections::BTreeMap;
use std::path::Path;

use plotters::prelude::*;
use serde::Serialize;

/// One answered release.
#[derive(Debug, Clone)]
pub struct Sample {
    /// Seconds since the soak started, when the answer came.
    pub at: f64,
    pub latency_ms: f64,
    /// The harness's own time for this release (from its audit record).
    pub overhead_ms: Option<f64>,
}

/// Memory of the measured process at a moment.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct RssPoint {
    pub at: f64,
    pub rss_kb: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Percentiles {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
}

pub fn percentiles(values: &[f64]) -> Percentiles {
    let mut sorted: Vec<f64> = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let at = |q: f64| -> f64 {
        if sorted.is_empty() {
            return 0.0;
        }
        let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
        sorted[rank - 1]
    };
    Percentiles {
        p50: at(0.50),
        p90: at(0.90),
        p99: at(0.99),
        max: sorted.last().copied().unwrap_or(0.0),
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub started_at: String,
    pub duration_s: f64,
    pub target_rate_per_s: f64,
    pub cores: usize,
    pub sent: u64,
    pub answered: u64,
    pub throughput_per_s: f64,
    pub latency_ms: Percentiles,
    pub overhead_ms: Percentiles,
    pub rss_start_kb: u64,
    pub rss_end_kb: u64,
    pub rss_max_kb: u64,
    /// The measured process's RSS over time (the plot's lower panel).
    pub rss_series: Vec<RssPoint>,
    pub outcomes: BTreeMap<String, u64>,
    pub scenarios: BTreeMap<String, u64>,
    pub violations: Vec<String>,
    /// Requests sent again after a 409, a 503 or a transport error (`--chaos`).
    pub retries: u64,
    /// The store's integrity after a chaos run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub integrity: Option<super::chaos::Integrity>,
    pub runs_in_flight_after: Option<f64>,
    pub plot: String,
    /// `--overload`: how the releases were admitted or shed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub overload: Option<OverloadReport>,
}

/// What an overload run (`soak --overload`, `scripts/overload.sh`) saw at the door.
#[derive(Debug, Clone, Serialize)]
pub struct OverloadReport {
    /// Releases answered 200 (admitted, or replayed).
    pub admitted: u64,
    /// `admitted` per second of the run.
    pub goodput_per_s: f64,
    /// Answered `503 overloaded`.
    pub shed: u64,
    /// Of those, without a `Retry-After` of at least 1 s (should be 0).
    pub shed_without_retry_after: u64,
    /// Time from sending to the `503 overloaded` answer.
    pub shed_latency_ms: Percentiles,
    /// Answered `503 store_unavailable` / `store_outcome_unknown` (should be 0).
    pub store_errors: u64,
    /// Any other answer that is not 200 or 503 overloaded, or no answer.
    pub other_errors: u64,
    /// Most file descriptors the measured process had open (sampled every second).
    pub fds_max: u64,
}

/// Open file descriptors of a process (Linux), or None.
pub fn open_fds(pid: u32) -> Option<u64> {
    Some(std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as u64)
}

/// Reads a process's resident set size from /proc (Linux), in kB.
pub fn rss_kb(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
}

/// Per-second p50/p99 latency series.
fn latency_series(samples: &[Sample]) -> Vec<(f64, f64, f64)> {
    let mut by_second: BTreeMap<u64, Vec<f64>> = BTreeMap::new();
    for s in samples {
        by_second.entry(s.at as u64).or_default().push(s.latency_ms);
    }
    by_second
        .into_iter()
        .map(|(second, values)| {
            let p = percentiles(&values);
            (second as f64, p.p50, p.p99)
        })
        .collect()
}

/// Why the plot could not be drawn (the SVG file could not be written).
pub type PlotError = plotters::drawing::DrawingAreaErrorKind<std::io::Error>;

/// Draws latency percentiles (top) and RSS (bottom) over time.
pub fn plot(path: &Path, samples: &[Sample], rss: &[RssPoint]) -> Result<(), PlotError> {
    let root = SVGBackend::new(path, (1000, 700)).into_drawing_area();
    root.fill(&WHITE)?;
    let (top, bottom) = root.split_vertically(350);
    let series = latency_series(samples);
    let x_max = series
        .last()
        .map(|s| s.0)
        .unwrap_or(1.0)
        .max(rss.last().map(|r| r.at).unwrap_or(1.0))
        .max(1.0);
    let y_max = series.iter().map(|s| s.2).fold(1.0, f64::max) * 1.1;
    let mut chart = ChartBuilder::on(&top)
        .caption("release latency (ms) per second", ("sans-serif", 20))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..x_max, 0f64..y_max)?;
    chart
        .configure_mesh()
        .x_desc("seconds")
        .y_desc("ms")
        .draw()?;
    chart
        .draw_series(LineSeries::new(series.iter().map(|s| (s.0, s.1)), &BLUE))?
        .label("p50")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLUE));
    chart
        .draw_series(LineSeries::new(series.iter().map(|s| (s.0, s.2)), &RED))?
        .label("p99")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], RED));
    chart.configure_series_labels().border_style(BLACK).draw()?;

    let rss_max = rss
        .iter()
        .map(|r| r.rss_kb as f64 / 1024.0)
        .fold(1.0, f64::max)
        * 1.2;
    let mut memory = ChartBuilder::on(&bottom)
        .caption("process RSS (MiB)", ("sans-serif", 20))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..x_max, 0f64..rss_max)?;
    memory
        .configure_mesh()
        .x_desc("seconds")
        .y_desc("MiB")
        .draw()?;
    memory.draw_series(LineSeries::new(
        rss.iter().map(|r| (r.at, r.rss_kb as f64 / 1024.0)),
        &GREEN,
    ))?;
    root.present()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_use_nearest_rank() {
        let values: Vec<f64> = (1..=100).map(f64::from).collect();
        let p = percentiles(&values);
        assert_eq!((p.p50, p.p90, p.p99, p.max), (50.0, 90.0, 99.0, 100.0));
        assert_eq!(percentiles(&[]).p99, 0.0);
    }

    #[test]
    fn a_plot_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("plot.svg");
        let samples: Vec<Sample> = (0..50)
            .map(|i| Sample {
                at: i as f64 / 10.0,
                latency_ms: 5.0 + i as f64,
                overhead_ms: Some(0.4),
            })
            .collect();
        let rss = vec![
            RssPoint {
                at: 0.0,
                rss_kb: 20_000,
            },
            RssPoint {
                at: 5.0,
                rss_kb: 21_000,
            },
        ];
        plot(&path, &samples, &rss).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.starts_with("<svg") && svg.contains("p99"));
    }
}
