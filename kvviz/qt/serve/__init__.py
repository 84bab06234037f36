"""The Serve mode: many requests through transformers' continuous batching and its paged cache, live."""
