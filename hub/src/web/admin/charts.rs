//! Charts for the admin page, drawn on the server as inline SVG: a line
//! chart of values per bucket of time, and a ranked list with bars. No
//! script and no stylesheet beyond the page's: each chart is a `<figure>`
//! whose `<svg>` has a `<title>` and an `aria-label`, with its numbers
//! beside it as text, so that they read without the picture. The geometry
//! is pure and tested here; what the charts show is the overview's.

use maud::{Markup, html};

/// The drawing's size in SVG units; it scales to the page's width.
const WIDTH: f64 = 640.0;
const HEIGHT: f64 = 180.0;

/// Room for the y axis' labels on the left and the x axis' below.
const LEFT: f64 = 48.0;
const BOTTOM: f64 = 22.0;
const TOP: f64 = 10.0;
const RIGHT: f64 = 10.0;

/// The width of a ranked list's longest bar.
const BAR_WIDTH: f64 = 240.0;
const BAR_HEIGHT: f64 = 14.0;

/// One line of a chart.
pub(super) struct Series<'a> {
    /// What it counts, as the legend and the table name it.
    pub(super) label: &'a str,
    /// Its colour.
    pub(super) colour: &'a str,
    /// One value per bucket; `None` where there is nothing to show (no
    /// attempt to take a percentile of).
    pub(super) values: Vec<Option<f64>>,
}

/// A line chart of values per bucket.
pub(super) struct LineChart<'a> {
    /// The `id` of its figure.
    pub(super) id: &'a str,
    /// Its title, which also says the bucket size.
    pub(super) title: &'a str,
    /// The unit of the values, after each number.
    pub(super) unit: &'a str,
    /// What the chart says when every value is zero or missing.
    pub(super) empty: &'a str,
    /// The bucket's labels (their start), one per value.
    pub(super) labels: Vec<String>,
    /// The lines, drawn in order.
    pub(super) series: Vec<Series<'a>>,
}

/// The smallest of 1, 2 or 5 times a power of ten at or above `value`:
/// the top of a chart's axis, so that its gridlines fall on round numbers.
pub(super) fn axis_top(value: f64) -> f64 {
    if value.is_nan() || value <= 0.0 {
        return 1.0;
    }
    let mut step = 10f64.powf(value.log10().floor());
    loop {
        for factor in [1.0, 2.0, 5.0] {
            if step * factor >= value {
                return step * factor;
            }
        }
        step *= 10.0;
    }
}

/// Where the value of bucket `index` of `count` goes in the drawing, for an
/// axis up to `top`.
pub(super) fn point(index: usize, count: usize, value: f64, top: f64) -> (f64, f64) {
    let plot_width = WIDTH - LEFT - RIGHT;
    let plot_height = HEIGHT - TOP - BOTTOM;
    let x = if count <= 1 {
        LEFT + plot_width / 2.0
    } else {
        LEFT + plot_width * index as f64 / (count - 1) as f64
    };
    let y = TOP + plot_height * (1.0 - (value / top).clamp(0.0, 1.0));
    (x, y)
}

/// The runs of a series' present values, as points of the drawing: a
/// missing value (no attempt to take a percentile of) ends a run rather
/// than drop to zero.
fn runs(values: &[Option<f64>], top: f64) -> Vec<Vec<(f64, f64)>> {
    let mut runs = Vec::new();
    let mut run = Vec::new();
    for (index, value) in values.iter().enumerate() {
        match value {
            Some(value) => run.push(point(index, values.len(), *value, top)),
            None if !run.is_empty() => runs.push(std::mem::take(&mut run)),
            None => {}
        }
    }
    if !run.is_empty() {
        runs.push(run);
    }
    runs
}

/// A run's points as a polyline's `points`.
fn points(run: &[(f64, f64)]) -> String {
    run.iter()
        .map(|(x, y)| format!("{x:.1},{y:.1}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// A number as the charts print it: whole when it is, else to one place.
pub(super) fn number(value: f64) -> String {
    if value.fract() == 0.0 {
        format!("{value:.0}")
    } else {
        format!("{value:.1}")
    }
}

impl LineChart<'_> {
    /// The largest value of every series.
    fn largest(&self) -> f64 {
        self.series
            .iter()
            .flat_map(|series| series.values.iter().flatten())
            .fold(0.0, |largest: f64, value| largest.max(*value))
    }

    /// Each series' total (for counts) or largest value, as the summary
    /// says it.
    fn summary(&self, totals: bool) -> String {
        self.series
            .iter()
            .map(|series| {
                let values = series.values.iter().flatten();
                let figure = if totals {
                    values.sum::<f64>()
                } else {
                    values.fold(0.0, |largest: f64, value| largest.max(*value))
                };
                format!("{} {}{}", series.label, number(figure), self.unit)
            })
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The figure: the drawing, a legend with each series' total (`totals`)
    /// or highest value, and the numbers per bucket in a table.
    pub(super) fn render(&self, totals: bool) -> Markup {
        let largest = self.largest();
        let top = axis_top(largest);
        let summary = self.summary(totals);
        let label = format!("{}: {summary}", self.title);
        let (x0, y0) = (LEFT, HEIGHT - BOTTOM);
        html! {
            figure.chart id=(self.id) {
                figcaption { strong { (self.title) } }
                svg xmlns="http://www.w3.org/2000/svg" role="img" aria-label=(label)
                    viewBox={ "0 0 " (WIDTH) " " (HEIGHT) } width="100%"
                    style="max-width: 40rem; display: block" {
                    title { (label) }
                    @for fraction in [0.0, 0.5, 1.0] {
                        @let y = TOP + (HEIGHT - TOP - BOTTOM) * (1.0 - fraction);
                        line x1=(x0) x2=(WIDTH - RIGHT) y1=(y) y2=(y)
                            stroke=(if fraction == 0.0 { "#555" } else { "#ddd" }) stroke-width="1" {}
                        text.tick x=(x0 - 4.0) y=(y + 4.0) text-anchor="end" font-size="11" {
                            (number(top * fraction))
                        }
                    }
                    line.axis x1=(x0) x2=(x0) y1=(TOP) y2=(y0) stroke="#555" stroke-width="1" {}
                    @if let Some(first) = self.labels.first() {
                        text x=(x0) y=(HEIGHT - 6.0) font-size="11" { (first) }
                    }
                    @if let Some(last) = self.labels.last() {
                        text x=(WIDTH - RIGHT) y=(HEIGHT - 6.0) text-anchor="end" font-size="11" {
                            (last)
                        }
                    }
                    @if largest <= 0.0 {
                        text.empty x=(LEFT + (WIDTH - LEFT - RIGHT) / 2.0)
                            y=(TOP + (HEIGHT - TOP - BOTTOM) / 2.0)
                            text-anchor="middle" font-size="14" fill="#555" { (self.empty) }
                    } @else {
                        @for series in &self.series {
                            @for run in runs(&series.values, top) {
                                @if let [(x, y)] = run.as_slice() {
                                    // A line of one point does not show.
                                    circle.series cx=(format!("{x:.1}")) cy=(format!("{y:.1}"))
                                        r="3" fill=(series.colour) {}
                                } @else {
                                    polyline.series points=(points(&run)) fill="none"
                                        stroke=(series.colour) stroke-width="2"
                                        stroke-linejoin="round" {}
                                }
                            }
                        }
                    }
                }
                p.legend {
                    @for series in &self.series {
                        span style={ "color: " (series.colour) } { "■ " }
                        (series.label) " "
                    }
                    span.summary { "(" (if totals { "totals" } else { "highest" }) ": " (summary) ")" }
                }
                details {
                    summary { "The numbers" }
                    table.numbers {
                        thead {
                            tr {
                                th { "From" }
                                @for series in &self.series { th { (series.label) } }
                            }
                        }
                        tbody {
                            @for (index, label) in self.labels.iter().enumerate() {
                                tr {
                                    td { (label) }
                                    @for series in &self.series {
                                        td.number {
                                            @if let Some(Some(value)) = series.values.get(index) {
                                                (number(*value))
                                            }
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// One row of a ranked list.
pub(super) struct Ranked<'a> {
    /// What is ranked (an endpoint).
    pub(super) name: &'a str,
    /// Where its name links to.
    pub(super) href: String,
    /// Its count, which orders the list.
    pub(super) count: u64,
}

/// How long the bar of `count` is when the list's largest is `largest`: at
/// least a sliver for a count above zero, so that it shows.
pub(super) fn bar_length(count: u64, largest: u64) -> f64 {
    if count == 0 || largest == 0 {
        return 0.0;
    }
    (BAR_WIDTH * count as f64 / largest as f64).max(2.0)
}

/// A ranked list with bars: a table of names and counts, each count with
/// its bar, scaled to the largest.
pub(super) fn bar_list(
    id: &str,
    title: &str,
    colour: &str,
    empty: &str,
    rows: &[Ranked<'_>],
) -> Markup {
    let largest = rows.iter().map(|row| row.count).max().unwrap_or(0);
    html! {
        figure.chart id=(id) {
            figcaption { strong { (title) } }
            @if rows.is_empty() {
                p.empty { (empty) }
            } @else {
                table.bars aria-label=(title) {
                    thead { tr { th { "Endpoint" } th { "Count" } th {} } }
                    tbody {
                        @for row in rows {
                            tr {
                                td.name { a href=(row.href) { (row.name) } }
                                td.number.count { (row.count) }
                                td {
                                    svg xmlns="http://www.w3.org/2000/svg" role="img"
                                        aria-label={ (row.name) ": " (row.count) }
                                        width=(BAR_WIDTH) height=(BAR_HEIGHT)
                                        viewBox={ "0 0 " (BAR_WIDTH) " " (BAR_HEIGHT) } {
                                        title { (row.name) ": " (row.count) }
                                        rect x="0" y="1" height=(BAR_HEIGHT - 2.0)
                                            width=(format!("{:.1}", bar_length(row.count, largest)))
                                            fill=(colour) {}
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chart(series: Vec<Series<'static>>) -> LineChart<'static> {
        LineChart {
            id: "test",
            title: "Deliveries per minute",
            unit: "",
            empty: "no deliveries",
            labels: (0..series[0].values.len())
                .map(|i| format!("{i}"))
                .collect(),
            series,
        }
    }

    #[test]
    fn the_axis_tops_at_a_round_number() {
        assert_eq!(axis_top(0.0), 1.0);
        assert_eq!(axis_top(-3.0), 1.0);
        assert_eq!(axis_top(1.0), 1.0);
        assert_eq!(axis_top(7.0), 10.0);
        assert_eq!(axis_top(11.0), 20.0);
        assert_eq!(axis_top(20.0), 20.0);
        assert_eq!(axis_top(21.0), 50.0);
        assert_eq!(axis_top(0.3), 0.5);
        assert_eq!(axis_top(950.0), 1000.0);
    }

    #[test]
    fn an_empty_series_draws_an_axis_and_says_so() {
        let markup = chart(vec![Series {
            label: "delivered",
            colour: "green",
            values: vec![Some(0.0); 60],
        }])
        .render(true)
        .into_string();
        assert!(markup.contains("class=\"axis\""), "{markup}");
        assert!(markup.contains(">no deliveries</text>"), "{markup}");
        assert!(!markup.contains("<polyline"), "{markup}");
        assert!(markup.contains("<title>Deliveries per minute: delivered 0</title>"));
        assert!(markup.contains("aria-label=\"Deliveries per minute: delivered 0\""));
    }

    #[test]
    fn the_largest_value_reaches_the_top_of_its_axis() {
        let top = axis_top(10.0);
        let (_, highest) = point(3, 4, 10.0, top);
        let (_, lowest) = point(0, 4, 0.0, top);
        assert_eq!(highest, TOP);
        assert_eq!(lowest, HEIGHT - BOTTOM);
        let (first, _) = point(0, 4, 0.0, top);
        let (last, _) = point(3, 4, 0.0, top);
        assert_eq!(first, LEFT);
        assert_eq!(last, WIDTH - RIGHT);
        // Halfway up for half the axis.
        let (_, half) = point(1, 4, 5.0, top);
        assert_eq!(half, TOP + (HEIGHT - TOP - BOTTOM) / 2.0);
    }

    #[test]
    fn counts_are_totalled_and_drawn_per_series() {
        let markup = chart(vec![
            Series {
                label: "delivered",
                colour: "green",
                values: vec![Some(1.0), Some(4.0), Some(0.0)],
            },
            Series {
                label: "failed",
                colour: "red",
                values: vec![Some(2.0), Some(0.0), Some(0.0)],
            },
        ])
        .render(true)
        .into_string();
        assert_eq!(markup.matches("<polyline").count(), 2, "{markup}");
        assert!(markup.contains("delivered 5, failed 2"), "{markup}");
        assert!(!markup.contains("no deliveries"));
    }

    #[test]
    fn the_99th_percentile_is_drawn_at_or_above_the_median() {
        let p50 = [Some(3.0), None, Some(12.0)];
        let p99 = [Some(40.0), None, Some(12.0)];
        let top = axis_top(40.0);
        for index in [0, 2] {
            let (_, median) = point(index, 3, p50[index].unwrap_or_default(), top);
            let (_, high) = point(index, 3, p99[index].unwrap_or_default(), top);
            assert!(high <= median, "bucket {index}: {high} below {median}");
        }
        // A bucket without attempts breaks the line rather than drop to 0;
        // a value alone is a dot.
        assert_eq!(runs(&p50, top).len(), 2);
        let markup = chart(vec![
            Series {
                label: "p50",
                colour: "blue",
                values: p50.to_vec(),
            },
            Series {
                label: "p99",
                colour: "orange",
                values: p99.to_vec(),
            },
        ])
        .render(false)
        .into_string();
        assert!(markup.contains("p50 12, p99 40"), "{markup}");
        assert_eq!(markup.matches("<circle").count(), 4, "{markup}");
        assert!(!markup.contains("<polyline"), "{markup}");
    }

    #[test]
    fn bars_scale_to_the_largest_count() {
        assert_eq!(bar_length(10, 10), BAR_WIDTH);
        assert_eq!(bar_length(5, 10), BAR_WIDTH / 2.0);
        assert_eq!(bar_length(0, 10), 0.0);
        assert_eq!(bar_length(1, 100_000), 2.0, "a sliver shows");
        let markup = bar_list(
            "failing",
            "Failing endpoints",
            "red",
            "none failing",
            &[
                Ranked {
                    name: "https://a.example/cb",
                    href: "/admin/endpoints".to_owned(),
                    count: 4,
                },
                Ranked {
                    name: "https://b.example/cb",
                    href: "/admin/endpoints".to_owned(),
                    count: 2,
                },
            ],
        )
        .into_string();
        assert!(markup.contains("width=\"240.0\" fill=\"red\""), "{markup}");
        assert!(markup.contains("width=\"120.0\" fill=\"red\""), "{markup}");
        assert!(markup.contains("<title>https://a.example/cb: 4</title>"));
        let empty = bar_list("failing", "Failing endpoints", "red", "none failing", &[]);
        assert!(empty.into_string().contains("none failing"));
    }
}
