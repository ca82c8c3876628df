//! Aligned plain-text tables for the CLI's human output: a header row and
//! rows, each column as wide as its widest cell, two spaces apart, no
//! trailing blanks. Written here rather than taken from a crate because
//! this is all the CLI needs of one; scripts read `--json` instead.

use std::fmt;

/// A table being filled in; [`Display`](fmt::Display) prints it.
#[derive(Debug, Clone)]
pub(crate) struct Table {
    headers: Vec<String>,
    rows: Vec<Vec<String>>,
}

/// The space between columns.
const GAP: &str = "  ";

impl Table {
    /// A table with these column headers.
    pub(crate) fn new<const N: usize>(headers: [&str; N]) -> Self {
        Self {
            headers: headers.iter().map(|header| (*header).to_owned()).collect(),
            rows: Vec::new(),
        }
    }

    /// Adds a row; cells past the headers are dropped, missing ones blank.
    pub(crate) fn row<I, S>(&mut self, cells: I)
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let mut row: Vec<String> = cells
            .into_iter()
            .take(self.headers.len())
            .map(|cell| single_line(cell.into()))
            .collect();
        row.resize(self.headers.len(), String::new());
        self.rows.push(row);
    }

    /// Whether it has no rows.
    pub(crate) fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    fn widths(&self) -> Vec<usize> {
        let mut widths: Vec<usize> = self.headers.iter().map(|h| width(h)).collect();
        for row in &self.rows {
            for (column, cell) in row.iter().enumerate() {
                widths[column] = widths[column].max(width(cell));
            }
        }
        widths
    }
}

/// A cell's width in characters (what a terminal shows for the text this
/// hub deals in: URLs, names, numbers, times).
fn width(cell: &str) -> usize {
    cell.chars().count()
}

/// A cell kept on one line, so that a multi-line error cannot break the
/// table's alignment.
fn single_line(cell: String) -> String {
    if cell.contains(['\n', '\r', '\t']) {
        cell.split(['\n', '\r', '\t'])
            .filter(|part| !part.is_empty())
            .collect::<Vec<_>>()
            .join(" ")
    } else {
        cell
    }
}

impl fmt::Display for Table {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let widths = self.widths();
        for row in std::iter::once(&self.headers).chain(&self.rows) {
            let mut line = String::new();
            for (column, cell) in row.iter().enumerate() {
                if column > 0 {
                    line.push_str(GAP);
                }
                line.push_str(cell);
                let pad = widths[column] - width(cell);
                line.extend(std::iter::repeat_n(' ', pad));
            }
            writeln!(f, "{}", line.trim_end())?;
        }
        Ok(())
    }
}

/// Named values, one a line, the values aligned: `name:  value`.
pub(crate) fn fields<const N: usize>(pairs: [(&str, String); N]) -> String {
    let widest = pairs.iter().map(|(name, _)| width(name)).max().unwrap_or(0);
    let mut shown = String::new();
    for (name, value) in pairs {
        let pad = widest - width(name);
        shown.push_str(name);
        shown.push(':');
        shown.extend(std::iter::repeat_n(' ', pad + GAP.len()));
        shown.push_str(&single_line(value));
        shown.push('\n');
    }
    shown
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_are_as_wide_as_their_widest_cell() {
        let mut table = Table::new(["TOPIC", "SUBSCRIBERS"]);
        table.row(["http://a.example/long-topic", "2"]);
        table.row(["http://b.example/t", "10"]);
        assert_eq!(
            table.to_string(),
            "TOPIC                        SUBSCRIBERS\n\
             http://a.example/long-topic  2\n\
             http://b.example/t           10\n"
        );
    }

    #[test]
    fn short_and_long_rows_fit_the_headers() {
        let mut table = Table::new(["A", "B", "C"]);
        table.row(["1"]);
        table.row(["1", "2", "3", "4"]);
        assert_eq!(table.to_string(), "A  B  C\n1\n1  2  3\n");
    }

    #[test]
    fn width_counts_characters_and_cells_stay_on_one_line() {
        let mut table = Table::new(["NAME", "X"]);
        table.row(["é", "1"]);
        table.row(["line\none\r\n", "2"]);
        assert_eq!(table.to_string(), "NAME      X\né         1\nline one  2\n");
    }

    #[test]
    fn fields_align_their_values() {
        assert_eq!(
            fields([
                ("state", "failed".to_owned()),
                ("last error", "500\nbody".to_owned())
            ]),
            "state:       failed\nlast error:  500 body\n"
        );
    }

    #[test]
    fn an_empty_table_is_its_header() {
        let table = Table::new(["ONE", "TWO"]);
        assert!(table.is_empty());
        assert_eq!(table.to_string(), "ONE  TWO\n");
    }
}
