"""Running the gateway: the app factory, its services, live reload, workers."""
