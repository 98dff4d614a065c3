"""The token issuer: `sealgate keys|mint|token|issuer`, and the minting service behind
`sealgate issuer serve` (its callers, limits and audit).

What a token is, and the keys it is sealed to, are the shared credentials library,
`sealgate.credentials`; this package only decides who may mint what, and serves it.
"""
