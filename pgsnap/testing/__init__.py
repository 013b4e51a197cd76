"""Tools for testing with pgsnap: the backend conformance suite and throwaway PostgreSQL servers."""
