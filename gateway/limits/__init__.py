"""What a tenant may spend: admission to the pools, rate limits, budgets, metering."""
