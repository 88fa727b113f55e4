//! The tables the one-shot commands print (`check`, `adopt`, `teardown`'s plan, the MetalLB
//! driver's `takeover`): aligned columns under upper-case headers, as kubectl prints them.

/// `rows` under `header`, each column as wide as its widest cell; the last column is not
/// padded.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (i, cell) in r.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(cell.chars().count());
            }
        }
    }
    let line = |cells: Vec<&str>| {
        let last = cells.len().saturating_sub(1);
        let mut out = String::new();
        for (i, c) in cells.iter().enumerate() {
            if i == last {
                out.push_str(c);
            } else {
                let pad = widths.get(i).copied().unwrap_or(0) - c.chars().count();
                out.push_str(c);
                out.push_str(&" ".repeat(pad + 3));
            }
        }
        out.push('\n');
        out
    };
    let mut out = line(header.to_vec());
    for r in rows {
        out.push_str(&line(r.iter().map(String::as_str).collect()));
    }
    out
}

/// One line of a report that passes or fails (`check`'s checks, `takeover`'s objects): what
/// it is about, whether it is ok, and what was found or done.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub subject: String,
    pub ok: bool,
    pub detail: String,
}

impl Row {
    pub fn new(subject: impl Into<String>, ok: bool, detail: impl Into<String>) -> Row {
        Row {
            subject: subject.into(),
            ok,
            detail: detail.into(),
        }
    }
}

/// ROWS as a [`table`]: SUBJECT, STATUS (`ok` or `FAIL`), DETAIL — the first and last
/// headers named by the report.
pub fn status_table(subject: &str, detail: &str, rows: &[Row]) -> String {
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                r.subject.clone(),
                if r.ok { "ok" } else { "FAIL" }.to_string(),
                r.detail.clone(),
            ]
        })
        .collect();
    table(&[subject, "STATUS", detail], &cells)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_align_under_their_headers() {
        let t = table(
            &["CHECK", "STATUS", "DETAIL"],
            &[
                vec!["crd/ipaddresses".into(), "ok".into(), "Established".into()],
                vec!["lease".into(), "FAIL".into(), "not held".into()],
            ],
        );
        assert_eq!(
            t,
            "CHECK             STATUS   DETAIL\n\
             crd/ipaddresses   ok       Established\n\
             lease             FAIL     not held\n"
        );
    }
}
