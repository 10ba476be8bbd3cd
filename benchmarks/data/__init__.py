"""Data shipped with the benchmarks: the Claude Code trace subset (claude_code_traces/)."""
