//! The tables a benchmark prints, kept to be written as JSON too
//! (`--json FILE`), and drawn from that JSON as SVG bar charts
//! (`websub-bench chart`), so that `docs/benchmarks.md` can show the
//! figures it lists as pictures made from the same runs.
//!
//! A table is printed as Markdown as it always was; each cell also keeps
//! its number, where it has one, so a chart never parses display text.
//! The SVG is written here rather than by a plotting library: a bar per
//! row, a label and a value each, needs no fonts, images or layout engine,
//! and keeps the bench's build (and CI's) as it was.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use crate::Failure;

/// One cell: what is shown, and the number behind it when there is one.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Cell {
    pub(crate) text: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) value: Option<f64>,
}

impl Cell {
    /// A cell of text alone.
    pub(crate) fn text(text: impl Into<String>) -> Self {
        Self {
            text: text.into(),
            value: None,
        }
    }

    /// A cell showing `text` for the number `value`.
    pub(crate) fn number(text: impl Into<String>, value: f64) -> Self {
        Self {
            text: text.into(),
            value: Some(value),
        }
    }
}

/// One printed table.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Table {
    /// The benchmark that printed it (`hub`, …).
    pub(crate) benchmark: String,
    /// What the lines above it said (the ceiling, the settings).
    pub(crate) notes: Vec<String>,
    pub(crate) columns: Vec<String>,
    pub(crate) rows: Vec<Vec<Cell>>,
}

impl Table {
    /// An empty table of `benchmark` with these column headings.
    pub(crate) fn new(benchmark: &str, columns: &[&str]) -> Self {
        Self {
            benchmark: benchmark.to_owned(),
            notes: Vec::new(),
            columns: columns.iter().map(|column| (*column).to_owned()).collect(),
            rows: Vec::new(),
        }
    }
}

/// A cell for an optional number: its text, or a dash.
pub(crate) fn maybe(value: Option<f64>, text: impl Fn(f64) -> String) -> Cell {
    value.map_or_else(|| Cell::text("–"), |value| Cell::number(text(value), value))
}

/// What a run wrote: its command line, when, and its tables.
#[derive(Debug, Serialize, Deserialize)]
struct Report {
    command: Vec<String>,
    finished_at: String,
    tables: Vec<Table>,
}

static TABLES: Mutex<Vec<Table>> = Mutex::new(Vec::new());

/// Prints `table` as Markdown (numbers right-aligned) and keeps it for the
/// JSON report.
pub(crate) fn print(table: Table) {
    let numeric: Vec<bool> = (0..table.columns.len())
        .map(|column| {
            table
                .rows
                .iter()
                .any(|row| row.get(column).is_some_and(|cell| cell.value.is_some()))
        })
        .collect();
    println!("| {} |", table.columns.join(" | "));
    let rule: Vec<&str> = numeric
        .iter()
        .map(|numeric| if *numeric { "---:" } else { "---" })
        .collect();
    println!("|{}|", rule.join("|"));
    for row in &table.rows {
        let cells: Vec<&str> = row.iter().map(|cell| cell.text.as_str()).collect();
        println!("| {} |", cells.join(" | "));
    }
    TABLES
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .push(table);
}

/// Writes every table printed so far to `path` as JSON.
pub(crate) fn write(path: &Path) -> Result<(), Failure> {
    let report = Report {
        command: std::env::args().collect(),
        finished_at: chrono::Utc::now().to_rfc3339(),
        tables: TABLES
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone(),
    };
    std::fs::write(path, serde_json::to_vec_pretty(&report)?)
        .map_err(|error| format!("writing {}: {error}", path.display()))?;
    Ok(())
}

/// `websub-bench chart`: a bar chart of one numeric column of a report's
/// table.
#[derive(Debug, clap::Args)]
pub(crate) struct ChartArgs {
    /// A report written with --json.
    report: PathBuf,
    /// The column to draw, by its heading (e.g. "deliveries/s").
    #[arg(long)]
    column: String,
    /// Which of the report's tables, from 0.
    #[arg(long, default_value_t = 0)]
    table: usize,
    /// The columns that name a bar, joined (by default every text column
    /// before the first number).
    #[arg(long, value_delimiter = ',')]
    label: Vec<String>,
    /// The chart's title.
    #[arg(long)]
    title: Option<String>,
    /// Where to write the SVG.
    #[arg(long)]
    out: PathBuf,
}

pub(crate) fn chart(args: ChartArgs) -> Result<(), Failure> {
    let text = std::fs::read_to_string(&args.report)
        .map_err(|error| format!("reading {}: {error}", args.report.display()))?;
    let report: Report = serde_json::from_str(&text)
        .map_err(|error| format!("{} is not a report: {error}", args.report.display()))?;
    let table = report.tables.get(args.table).ok_or_else(|| {
        format!(
            "--table {}: the report has {} tables",
            args.table,
            report.tables.len()
        )
    })?;
    let column = table
        .columns
        .iter()
        .position(|heading| *heading == args.column)
        .ok_or_else(|| {
            format!(
                "--column {:?}: the table's columns are {:?}",
                args.column, table.columns
            )
        })?;
    let labels: Vec<usize> = if args.label.is_empty() {
        let first_number = table
            .rows
            .first()
            .and_then(|row| row.iter().position(|cell| cell.value.is_some()))
            .unwrap_or(1);
        (0..first_number).collect()
    } else {
        args.label
            .iter()
            .map(|heading| {
                table
                    .columns
                    .iter()
                    .position(|known| known == heading)
                    .ok_or_else(|| format!("--label {heading:?}: no such column"))
            })
            .collect::<Result<_, _>>()?
    };
    let bars: Vec<(String, f64, String)> = table
        .rows
        .iter()
        .filter_map(|row| {
            let cell = row.get(column)?;
            let label = labels
                .iter()
                .filter_map(|index| row.get(*index).map(|cell| cell.text.as_str()))
                .collect::<Vec<_>>()
                .join(" · ");
            Some((label, cell.value?, cell.text.clone()))
        })
        .collect();
    if bars.is_empty() {
        return Err(format!("--column {:?} holds no number", args.column).into());
    }
    let title = args
        .title
        .unwrap_or_else(|| format!("{} ({})", args.column, table.benchmark));
    std::fs::write(&args.out, svg(&title, &bars))
        .map_err(|error| format!("writing {}: {error}", args.out.display()))?;
    println!("wrote {} ({} bars)", args.out.display(), bars.len());
    Ok(())
}

/// Text safe inside SVG.
fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Horizontal bars, one per row, scaled to the largest value.
fn svg(title: &str, bars: &[(String, f64, String)]) -> String {
    // The label column fits the longest label (about 7 units a character
    // at this font size), so that no label runs off the left edge.
    let longest = bars
        .iter()
        .map(|(label, _, _)| label.chars().count())
        .max()
        .unwrap_or(0);
    let label_width = (longest as f64 * 7.0 + 24.0).clamp(120.0, 600.0);
    const BAR: f64 = 420.0;
    const ROW: f64 = 26.0;
    const TOP: f64 = 40.0;
    let width = label_width + BAR + 120.0;
    let height = TOP + ROW * bars.len() as f64 + 12.0;
    let largest = bars
        .iter()
        .map(|(_, value, _)| *value)
        .fold(0.0_f64, f64::max)
        .max(f64::MIN_POSITIVE);
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="system-ui, sans-serif" font-size="13">"#
    );
    let _ = writeln!(
        out,
        r##"<rect width="100%" height="100%" fill="#ffffff"/>"##
    );
    let _ = writeln!(
        out,
        r##"<text x="12" y="24" font-size="15" font-weight="600" fill="#1d1d1f">{}</text>"##,
        escape(title)
    );
    for (index, (label, value, text)) in bars.iter().enumerate() {
        let y = TOP + ROW * index as f64;
        let length = (value.max(0.0) / largest * BAR).max(1.0);
        let _ = writeln!(
            out,
            r##"<text x="{x}" y="{ty}" text-anchor="end" fill="#1d1d1f">{label}</text>"##,
            x = label_width - 8.0,
            ty = y + 15.0,
            label = escape(label)
        );
        let _ = writeln!(
            out,
            r##"<rect x="{label_width}" y="{ry}" width="{length:.1}" height="{h}" fill="#4a78c2"/>"##,
            ry = y + 3.0,
            h = ROW - 8.0
        );
        let _ = writeln!(
            out,
            r##"<text x="{x:.1}" y="{ty}" fill="#1d1d1f">{text}</text>"##,
            x = label_width + length + 6.0,
            ty = y + 15.0,
            text = escape(text)
        );
    }
    out.push_str("</svg>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bars_are_scaled_to_the_largest_and_text_is_escaped() {
        let svg = svg(
            "a <title>",
            &[
                ("one & two".to_owned(), 50.0, "50/s".to_owned()),
                ("three".to_owned(), 100.0, "100/s".to_owned()),
            ],
        );
        assert!(svg.contains("a &lt;title&gt;"));
        assert!(svg.contains("one &amp; two"));
        assert!(svg.contains(r#"width="210.0""#), "half of the longest bar");
        assert!(svg.contains(r#"width="420.0""#));
        assert!(svg.trim_end().ends_with("</svg>"));
    }
}
