"""The store room: trace files in, cached Parquet events out, and the TraceSet over them;
it may import the parsers, the analyses' pure helpers, and the vocabulary (schema, errors,
naming, selection), never the Run, the outputs, capture or the CLI."""
