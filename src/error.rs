//! Errors an operator reads: every problem in an input file names the file, the line and
//! the field, and all of them are reported at once.

use std::fmt;
use std::path::PathBuf;

/// How bad an issue is: errors refuse the input, warnings are printed and accepted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Severity {
    Error,
    Warning,
}

/// One problem in one input file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigIssue {
    pub severity: Severity,
    pub file: PathBuf,
    /// 1-based line, when it could be found.
    pub line: Option<usize>,
    /// Dotted path of the field (`regions[1].weights.akamai`), or the zone record.
    pub field: String,
    pub message: String,
}

impl ConfigIssue {
    pub fn error(
        file: impl Into<PathBuf>,
        line: Option<usize>,
        field: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        ConfigIssue {
            severity: Severity::Error,
            file: file.into(),
            line,
            field: field.into(),
            message: message.into(),
        }
    }

    pub fn warning(
        file: impl Into<PathBuf>,
        line: Option<usize>,
        field: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        ConfigIssue {
            severity: Severity::Warning,
            ..ConfigIssue::error(file, line, field, message)
        }
    }

    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }
}

/// `steering.yaml:12: regions[1].weights.akamai: unknown CDN "akamai"`, the shape
/// compilers use, so editors can jump to it.
impl fmt::Display for ConfigIssue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.severity == Severity::Warning {
            f.write_str("warning: ")?;
        }
        write!(f, "{}", self.file.display())?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
        }
        if !self.field.is_empty() {
            write!(f, ": {}", self.field)?;
        }
        write!(f, ": {}", self.message)
    }
}

/// Everything wrong with a set of inputs. Holds warnings too, so that a successful load
/// can still report them.
#[derive(Clone, Debug, Default)]
pub struct Issues(pub Vec<ConfigIssue>);

impl Issues {
    pub fn push(&mut self, issue: ConfigIssue) {
        self.0.push(issue);
    }

    pub fn extend(&mut self, other: Issues) {
        self.0.extend(other.0);
    }

    pub fn has_errors(&self) -> bool {
        self.0.iter().any(ConfigIssue::is_error)
    }

    pub fn errors(&self) -> impl Iterator<Item = &ConfigIssue> {
        self.0.iter().filter(|i| i.is_error())
    }

    pub fn warnings(&self) -> impl Iterator<Item = &ConfigIssue> {
        self.0.iter().filter(|i| !i.is_error())
    }
}

impl fmt::Display for Issues {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.errors().count();
        writeln!(
            f,
            "{n} error{} in the configuration:",
            if n == 1 { "" } else { "s" }
        )?;
        for issue in self.errors() {
            writeln!(f, "  {issue}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Issues {}
