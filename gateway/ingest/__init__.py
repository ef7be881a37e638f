"""Ingest: read documents, chunk them, embed the chunks and write them to a tenant's index."""
