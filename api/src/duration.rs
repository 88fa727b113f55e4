//! Durations as the API spells them (`30s`, `15m`, `24h`, `1h30m`, `1.5h`, `250ms`): the
//! Go `time.ParseDuration` grammar without a sign. [`PATTERN`] is the same grammar as a
//! regular expression; the CRD's CEL rule uses it so the API server rejects exactly what
//! [`parse`] rejects, except values too large to represent (which [`parse`] reports).

use std::time::Duration;

/// RE2 pattern accepted by `spec.releaseDelay` (checked by CEL at admission).
pub const PATTERN: &str = r"^([0-9]+(\.[0-9]+)?(ns|us|µs|μs|ms|s|m|h))+$";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    #[error("{0:?} is not a duration such as 30s, 15m, 24h or 1h30m")]
    Syntax(String),
    #[error("{0:?} is too large")]
    Overflow(String),
}

const UNITS: [(&str, u128); 8] = [
    ("ns", 1),
    ("us", 1_000),
    ("µs", 1_000),
    ("μs", 1_000),
    ("ms", 1_000_000),
    ("s", 1_000_000_000),
    ("m", 60_000_000_000),
    ("h", 3_600_000_000_000),
];

/// Parses a duration string.
pub fn parse(s: &str) -> Result<Duration, DurationError> {
    let syntax = || DurationError::Syntax(s.to_string());
    let overflow = || DurationError::Overflow(s.to_string());
    if s.is_empty() {
        return Err(syntax());
    }
    let mut rest = s;
    let mut total_ns: u128 = 0;
    while !rest.is_empty() {
        let int_len = rest.bytes().take_while(u8::is_ascii_digit).count();
        if int_len == 0 {
            return Err(syntax());
        }
        let (int_part, after) = rest.split_at(int_len);
        let (frac_part, after) = match after.strip_prefix('.') {
            Some(f) => {
                let n = f.bytes().take_while(u8::is_ascii_digit).count();
                if n == 0 {
                    return Err(syntax());
                }
                f.split_at(n)
            }
            None => ("", after),
        };
        // Longest unit first so "ms" is not read as "m" followed by garbage.
        let (unit, scale) = UNITS
            .iter()
            .filter(|(u, _)| after.starts_with(u))
            .max_by_key(|(u, _)| u.len())
            .ok_or_else(syntax)?;
        let int: u128 = int_part.parse().map_err(|_| overflow())?;
        let mut value = int.checked_mul(*scale).ok_or_else(overflow)?;
        // Fractions: keep up to 18 digits, enough for nanosecond precision on any unit.
        let frac_digits = &frac_part[..frac_part.len().min(18)];
        if !frac_digits.is_empty() {
            let frac: u128 = frac_digits.parse().map_err(|_| overflow())?;
            let denom = 10u128.pow(frac_digits.len() as u32);
            value = value
                .checked_add(frac * scale / denom)
                .ok_or_else(overflow)?;
        }
        total_ns = total_ns.checked_add(value).ok_or_else(overflow)?;
        rest = &after[unit.len()..];
    }
    let secs = u64::try_from(total_ns / 1_000_000_000).map_err(|_| overflow())?;
    Ok(Duration::new(secs, (total_ns % 1_000_000_000) as u32))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_the_go_grammar() {
        let cases = [
            ("30s", Duration::from_secs(30)),
            ("15m", Duration::from_secs(900)),
            ("24h", Duration::from_secs(86_400)),
            ("1h30m", Duration::from_secs(5_400)),
            ("1.5h", Duration::from_secs(5_400)),
            ("250ms", Duration::from_millis(250)),
            ("1m0.5s", Duration::from_millis(60_500)),
            ("10us", Duration::from_micros(10)),
            ("10µs", Duration::from_micros(10)),
            ("7ns", Duration::from_nanos(7)),
            ("0s", Duration::ZERO),
            ("2h2h", Duration::from_secs(4 * 3600)),
        ];
        for (input, want) in cases {
            assert_eq!(parse(input), Ok(want), "{input:?}");
        }
    }

    #[test]
    fn rejects_everything_else() {
        for input in [
            "", "30", "s", "-30s", "+30s", "1d", "1.h", ".5h", "1h ", " 1h", "1H", "1h30", "P1D",
        ] {
            assert!(
                matches!(parse(input), Err(DurationError::Syntax(_))),
                "{input:?}"
            );
        }
        assert!(matches!(
            parse("99999999999999999999999999999999999999999h"),
            Err(DurationError::Overflow(_))
        ));
        assert!(parse("1x").unwrap_err().to_string().contains("such as 30s"));
    }

    /// The CEL rule (regex) and the parser must agree, or admission and the controller
    /// would disagree about which delays are valid.
    #[test]
    fn pattern_agrees_with_parser() {
        let re = regex::Regex::new(PATTERN).unwrap();
        for input in [
            "30s", "15m", "24h", "1h30m", "1.5h", "250ms", "10µs", "10μs", "0s", "", "30", "-30s",
            "1d", "1.h", ".5h", "1h ", "1H", "1h30", "P1D", "1m0.5s",
        ] {
            assert_eq!(re.is_match(input), parse(input).is_ok(), "{input:?}");
        }
    }
}
