"""The NNFusion row format: identifiers, kernel JSON, the nine columns, profiles, lint, export."""
