"""What lightning_omni and lightning_unilab share: small, dependency-free helpers (validators)."""
