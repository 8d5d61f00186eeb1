import Foundation

/// Turns the PNG or JPEG bytes of a job's image feature into the model's input tensor, as Core ML's
/// `MLFeatureValue(cgImage:constraint:)` followed by the network's preprocessing scaler would:
///
/// 1. decode (PNG or JPEG, by signature) to 8-bit samples;
/// 2. drop alpha by compositing on black (each colour sample times alpha/255), as drawing the image
///    into a cleared, premultiplied BGRA buffer and ignoring its alpha does;
/// 3. convert to the constraint's colour space: gray = 0.299 R + 0.587 G + 0.114 B; a gray image
///    feeding an RGB/BGR input repeats its one value in all three channels;
/// 4. scale the whole image to the constraint's width × height, ignoring aspect ratio (Vision's "scale
///    fill" crop-and-scale option: nothing cropped, nothing padded), with the filter in `Resampler`.
///    Apple's documentation does not state which option `MLFeatureValue` uses when none is given;
///    this is the one that keeps every pixel, and producers who care send the model's aspect ratio;
/// 5. apply the scaler, `channelScale · x + bias`, x on the 0…255 scale.
///
/// Colour conversion happens while resampling (each output channel reads the decoded samples through
/// a function), so a large photo costs its 8-bit samples plus one target-width float band per channel.
///
/// The result is float32 in Core ML's channel-first order `[C, H, W]`: R, G, B planes for RGB,
/// B, G, R for BGR, one plane for grayscale.
public enum ImageInput {
    public static func tensor(from bytes: Data, constraint: ImageConstraint, scaler: ImageScaler?,
                              limits: ImageLimits = .standard) throws(ImageInputError) -> [Float] {
        let decoded = try bytes.withUnsafeBytes { raw -> Result<DecodedImage, ImageInputError> in
            do throws(ImageInputError) { return .success(try decodeImage(raw, limits: limits)) }
            catch { return .failure(error) }
        }.get()
        return tensor(from: decoded, constraint: constraint, scaler: scaler ?? .identity)
    }

    static func tensor(from image: DecodedImage, constraint: ImageConstraint, scaler: ImageScaler) -> [Float] {
        let resampler = Resampler(width: image.width, height: image.height,
                                  targetWidth: constraint.width, targetHeight: constraint.height)
        let biases = scaler.biases(for: constraint.colorSpace)
        var out: [Float] = []
        out.reserveCapacity(constraint.count)
        image.samples.withUnsafeBufferPointer { samples in
            let stride = image.channels
            let alpha = image.hasAlpha ? stride - 1 : -1
            /// Source channel c of pixel p on the 0…255 scale, composited on black.
            func sample(_ p: Int, _ c: Int) -> Float {
                let value = Float(samples[p * stride + c])
                return alpha < 0 ? value : value * Float(samples[p * stride + alpha]) / 255
            }
            let channels: [(Int) -> Float]
            switch (constraint.colorSpace, image.isColor) {
            case (.grayscale, false): channels = [{ sample($0, 0) }]
            case (.grayscale, true):
                channels = [{ 0.299 * sample($0, 0) + 0.587 * sample($0, 1) + 0.114 * sample($0, 2) }]
            case (.rgb, true): channels = [{ sample($0, 0) }, { sample($0, 1) }, { sample($0, 2) }]
            case (.bgr, true): channels = [{ sample($0, 2) }, { sample($0, 1) }, { sample($0, 0) }]
            case (.rgb, false), (.bgr, false): channels = Array(repeating: { sample($0, 0) }, count: 3)
            }
            for (value, bias) in zip(channels, biases) {
                out.append(contentsOf: resampler.resize(value).map { scaler.channelScale * $0 + bias })
            }
        }
        return out
    }
}
