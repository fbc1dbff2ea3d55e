"""Measurements and what is done with them: the profile dataset (`dataset`, its parquet tables beside this module),
which configurations to measure (`design`), measuring them (`collect`), how noisy they are (`noise`), judging
predictors on them (`evaluate`), fine-tuning on new ones (`finetune`), and this machine's identity that fingerprints
them (`machine`). The device facts and kernel profiles the costs read are files here too (`device_facts.json`,
`profiles/`)."""
