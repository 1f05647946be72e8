"""The InferenceService, defined once: the CRD as package data and its schema
(:mod:`.schema`), the typed view (:mod:`.resource`), ``metav1.Condition`` helpers
(:mod:`.conditions`), and the byte-preserving YAML edit (:mod:`.yamledit`)."""
