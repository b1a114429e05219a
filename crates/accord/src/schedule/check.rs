//! Symbolic checker for schedules.
