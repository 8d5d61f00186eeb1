/// One job partition of one generation of partitions. `attune topology repartition` starts a new
/// generation with another count: users hash onto the new generation's queues, and the old generation's
/// are drained before any worker takes a job from the new ones, so a user's jobs stay in publish order.
public struct JobPartition: Hashable, Comparable, Sendable, CustomStringConvertible {
    public let generation: Int
    public let index: Int

    /// The most partitions a generation may have: queue names keep to three digits.
    public static let maxCount = 999

    public init(generation: Int, index: Int) {
        self.generation = generation
        self.index = index
    }

    /// The PostgreSQL advisory lock key of its lease. Generation 0's are the bare partition numbers that
    /// workers used before generations existed, so a worker of either kind respects the other's leases.
    public var leaseKey: Int { generation * (Self.maxCount + 1) + index }

    public init(leaseKey: Int) {
        self.init(generation: leaseKey / (Self.maxCount + 1), index: leaseKey % (Self.maxCount + 1))
    }

    public static func all(count: Int, generation: Int) -> [JobPartition] {
        (0..<count).map { JobPartition(generation: generation, index: $0) }
    }

    public var description: String { generation == 0 ? "p\(index)" : "g\(generation).p\(index)" }

    public static func < (a: JobPartition, b: JobPartition) -> Bool {
        (a.generation, a.index) < (b.generation, b.index)
    }
}

/// Which partitions the fleet runs on, as PostgreSQL keeps it (`attune_topology`): normally one generation;
/// during a repartition also the generation being drained, whose queues the workers consume until every
/// one of them is empty, while new jobs wait in the new generation's.
public struct PartitionLayout: Sendable, Equatable {
    public struct Generation: Sendable, Equatable {
        public let number: Int
        public let partitions: Int

        public init(number: Int, partitions: Int) {
            self.number = number
            self.partitions = partitions
        }

        public var all: [JobPartition] { JobPartition.all(count: partitions, generation: number) }
    }

    /// Where producers' jobs go now.
    public let current: Generation
    /// The generation a repartition drains, if one is under way.
    public let draining: Generation?
    /// Whether the draining generation's queues no longer receive new jobs: only then can a partition
    /// found empty stay empty, and be recorded as drained.
    public let drainingUnbound: Bool
    /// A generation drained and left behind whose queues may still exist (until `repartition` deletes them).
    public let retired: Generation?

    public init(current: Generation, draining: Generation? = nil, drainingUnbound: Bool = false, retired: Generation? = nil) {
        self.current = current
        self.draining = draining
        self.drainingUnbound = drainingUnbound
        self.retired = retired
    }

    /// A fleet of one generation.
    public static func single(_ partitions: Int, generation: Int = 0) -> PartitionLayout {
        PartitionLayout(current: Generation(number: generation, partitions: partitions))
    }

    /// The generation workers take jobs from: the draining one while there is one, so no job of the new
    /// generation overtakes an older job of its user.
    public var consumed: Generation { draining ?? current }
}
