"""In-memory stand-ins for the gateway's seams, for tests that run the app in process."""
