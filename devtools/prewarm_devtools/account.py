"""The AWS account and region everything local runs in: moto's server (`sam.aws`), the ARNs the AWS limits
layer hands out (`aws_limits.eks`), the registry that plays ECR (`localecr`)."""

REGION = "us-west-2"
ACCOUNT = "123456789012"
