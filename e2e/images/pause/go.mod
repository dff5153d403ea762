module orchestrator.io/e2e/images/pause

go 1.22
