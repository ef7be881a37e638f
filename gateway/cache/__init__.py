"""The response cache's rules, one module a job: `keys` (what an answer is filed under),
`guards` (when a paraphrase may not share an answer), `policy` (which answers may be stored)
and `single_flight` (one computation for concurrent identical misses). `gateway.cache.response`
puts them together over a `backends.cache.base.CacheStore`."""
