"""The run room: one window of a TraceSet (the Run), its options, the Result every command
returns, and the per-rank summaries of cluster-scale runs; it may import the store, the
analyses, the parsers and the vocabulary, never the outputs, capture or the CLI."""
